"""The registry's Redis keys, its TTLs and waits, and the service roles."""

# --- registry (Redis) -----------------------------------------------------------------
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_JOB_ID = "default"
KEY_PREFIX = "pyrsia"
"""Every key is ``pyrsia:<job id>:...`` so that several jobs can share one Redis."""


def service_key(job_id: str, role: str, replica_index: int) -> str:
    """Key holding one replica's registration record (a short-lived heartbeat)."""
    return f"{KEY_PREFIX}:{job_id}:svc:{role}:{replica_index}"


def service_pattern(job_id: str, role: str) -> str:
    """SCAN pattern matching every replica of ``role``."""
    return f"{KEY_PREFIX}:{job_id}:svc:{role}:*"


def master_addr_key(job_id: str) -> str:
    """Key where NN-worker rank 0 publishes the torch.distributed master address."""
    return f"{KEY_PREFIX}:{job_id}:nn_master_addr"


def lease_key(job_id: str) -> str:
    """Hash holding the job lease: its instance and which process holds each slot
    (pyrsia/shared/job_lease.py)."""
    return f"{KEY_PREFIX}:{job_id}:lease"


REGISTRATION_TTL_S = 6.0
"""A replica that stops refreshing disappears from the registry after this long."""
HEARTBEAT_INTERVAL_S = 1.5
LEASE_TTL_S = REGISTRATION_TTL_S
"""A slot of the job lease whose holder has not refreshed it for this long is free, and the
lease itself lapses this long after its last member's heartbeat."""
LEASE_CLAIM_POLL_S = 0.5
"""How often a process waiting for a slot held on another host to lapse asks again."""
REDIS_SOCKET_TIMEOUT_S = 2.0
REDIS_STARTUP_WAIT_S = 3.0
"""How long a starting service waits for Redis (under a Procfile it starts alongside, and
answers within a second of its start; a service's own imports take longer): a Redis that is
down is reported within 5 s."""
REDIS_RESTART_LIMIT = 5
REDIS_RESTART_WINDOW_S = 60.0
"""``pyrsia.shared.redis_local --restart-on-failure`` gives up (and exits, so honcho stops the job)
after this many restarts of redis-server within this many seconds: a crash loop is not
ridden through."""
REDIS_RESTART_DELAY_S = 0.2
DISCOVERY_POLL_INTERVAL_S = 0.1
DEFAULT_WAIT_TIMEOUT_S = 120.0
"""How long a service or context waits for the replicas it needs before giving up."""
WAIT_REPORT_INTERVAL_S = 5.0
"""A process waiting for Redis or for replicas says what it waits for this often."""

# --- roles ----------------------------------------------------------------------------
ROLE_EMBEDDING_PS = "embedding_parameter_server"
ROLE_EMBEDDING_WORKER = "embedding_worker"
ROLE_NN_WORKER = "nn_worker"
ROLE_NN_WORKER_NODE = "nn_worker_node"
"""A ``persia-launcher nn-worker`` process (one per node): a slot of the job lease only."""
ROLE_DATA_LOADER = "data_loader"
"""A ``persia-launcher data-loader`` process: a slot of the job lease only."""
MASTER_ADDR_TTL_S = 3600.0
"""Lifetime of the torch.distributed master address rank 0 publishes in Redis."""
