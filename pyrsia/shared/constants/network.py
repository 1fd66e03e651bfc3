"""HTTP and the wire: message formats and their caps, default ports, request and
shutdown timeouts, retries and back-off."""

# --- wire -----------------------------------------------------------------------------
MSGPACK_CONTENT_TYPE = "application/msgpack"
NDARRAY_EXT_CODE = 42
MAX_MESSAGE_BYTES = 1 << 30
"""Largest request or response body a service accepts (1 GiB; ``PYRSIA_MAX_MESSAGE_BYTES``)."""
MAX_ARRAY_DIMS = 8
INFLIGHT_BYTES_CAPS = 2
"""Default in-flight bound: this many per-request caps (two largest bodies, or any mix) ..."""
INFLIGHT_BYTES_MEMORY_SHARE = 8
"""... but at most 1/this of physical memory, and never less than one per-request cap."""
INFLIGHT_BYTES_WAIT_S = 1.0
"""How long a request waits for room under the in-flight bound before its 503."""
INFLIGHT_BYTES_RETRY_AFTER_S = 1
"""``Retry-After`` (seconds) of that 503."""
BODY_TIMEOUT_S = 30.0
"""Longest gap in a request body, and the grace before ``BODY_MIN_RATE`` applies."""
BODY_MIN_RATE = 1 << 20
"""Least average rate (bytes/s) of a request body once its first ``BODY_TIMEOUT_S`` are over."""
HEADER_TIMEOUT_S = 10.0
"""Longest a connection may take to send a request line and headers (from its first byte, or
from the accept) before the server closes it (``pyrsia.shared.http_connections``)."""
IDLE_TIMEOUT_S = 75.0
"""Longest a keep-alive connection may sit idle between requests before the server closes it."""
MAX_CONNECTIONS_CAP = 4096
"""Default bound on one service's connections: half its file-descriptor limit, at most this."""

# --- HTTP -----------------------------------------------------------------------------
DEFAULT_BIND_HOST = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
"""torch's rendezvous port on node 0 when neither ``--master-port`` nor ``MASTER_PORT`` is set."""
DEFAULT_REQUEST_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0
DEFAULT_RETRIES = 3
RETRY_BACKOFF_S = 0.05
RETRY_BACKOFF_MAX_S = 2.0
BACKPRESSURE_BACKOFF_S = 0.005
BACKPRESSURE_BACKOFF_MAX_S = 0.2
INGRESS_ROOM_WAIT_S = 0.25
"""How long an NN worker's /ingress holds a batch that finds its queue full, waiting for the
training loop to take one, before it answers 429. Answering at once sent the data loader
into its backoff (up to BACKPRESSURE_BACKOFF_MAX_S), and the loop then starved for up to
0.2 s after draining the queue (Census e2e: 170-200 ms stalls, ~1 s of an 8 s epoch)."""
CONNECTION_POOL_LIMIT = 64
SHUTDOWN_GRACE_S = 3.0
"""On SIGTERM a service finishes in-flight requests for at most this long, then cancels them."""
SHUTDOWN_CANCEL_S = 1.0
"""After the grace period, how long aiohttp waits for cancelled handlers to unwind."""
DEREGISTER_TIMEOUT_S = 0.5
"""Longest a stopping service spends deleting its registry record (Redis may be gone already)."""
SIGTERM_DRAIN_S = 2.5
"""An NN-worker rank's longest wait for its in-flight embedding gradients after SIGTERM."""
SIGTERM_DEADLINE_S = 4.0
"""An NN-worker rank still running this long after SIGTERM (its exit path is stuck, e.g. on
a dead Redis) dumps its threads' stacks and exits 1: before honcho's SIGKILL at 5 s, which
reaches only torch's launcher and would leave the rank orphaned, holding the job's output."""
SHUTDOWN_BUDGET_S = 5.0
"""SIGTERM to exit 0, at most (honcho and docker compose kill after their own grace period):
SHUTDOWN_GRACE_S + SHUTDOWN_CANCEL_S + DEREGISTER_TIMEOUT_S + process exit must fit in it."""
METRICS_PUSH_TIMEOUT_S = 2.0
"""One periodic push to the metrics gateway gives up after this long."""
METRICS_FINAL_PUSH_TIMEOUT_S = 0.3
"""The push on shutdown; short, so that SIGTERM still ends a service within SHUTDOWN_BUDGET_S."""
LOOKUP_TIMEOUT_S = 120.0
"""An NN worker's /lookup, /lookup_direct and /gradients calls to an embedding worker."""
GRADIENT_CARRY_WAIT_S = 0.5
"""How long an NN worker keeps a batch's embedding gradients for the next lookup to carry
(``pyrsia.services.nn_worker.carry``) before it sends them alone on ``/gradients``."""
GRADIENT_CARRY_RECENT_S = 5.0
"""An NN worker keeps gradients for a lookup to carry only while carrying lookups run: the
last one started at most this long ago (not with direct datasets or during evaluation)."""
ADMIN_TIMEOUT_S = 3600.0
"""Dumps and loads of large tables take long; they still have a bound."""
HEALTH_CHECK_TIMEOUT_S = 5.0
HEALTH_POLL_S = 0.1
"""How often a waiting context re-asks ``/health`` of a peer that is not ready yet."""
PS_RETRY_WINDOW_S = 30.0
"""How long an embedding worker keeps re-resolving and retrying an unreachable PS replica."""
PS_REDISCOVER_TIMEOUT_S = 2.0
PS_SETUP_REPLAY_TIMEOUT_S = 5.0
"""Replaying /configure and /register_optimizer to a PS replica that restarted."""

# --- default ports (Procfile / compose) -----------------------------------------------
DEFAULT_PS_PORT = 8888
DEFAULT_EMBEDDING_WORKER_PORT = 8887

# --- embedding checkpoints (PS /dump, serving artifacts) ------------------------------
EMBEDDING_CHECKPOINT_FORMAT = "pyrsia-embedding-checkpoint"
EMBEDDING_CHECKPOINT_VERSION = 1
