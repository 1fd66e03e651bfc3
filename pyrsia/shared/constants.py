"""Every registry key, TTL, default port, size cap and timeout Pyrsia uses, in one place.

Nothing else in the code base spells a Redis key or picks a timeout by itself: it
imports the value from here, so the whole protocol surface can be read at once.
"""

from __future__ import annotations

# --- environment variables -------------------------------------------------------------
ENV_REDIS_URL = "PERSIA_REDIS_URL"
ENV_JOB_ID = "PERSIA_JOB_ID"
ENV_EMBEDDING_CONFIG = "PERSIA_EMBEDDING_CONFIG"
ENV_GLOBAL_CONFIG = "PERSIA_GLOBAL_CONFIG"
ENV_NN_WORKER_ENTRY = "PERSIA_NN_WORKER_ENTRY"
ENV_DATALOADER_ENTRY = "PERSIA_DATALOADER_ENTRY"
ENV_ADVERTISE_HOST = "PERSIA_ADVERTISE_HOST"
ENV_LOG_LEVEL = "LOG_LEVEL"
ENV_RANK_AGENT_PID = "PERSIA_RANK_AGENT_PID"
"""Set by ``persia-launcher nn-worker`` for its ranks: the pid of the process that starts them.
A rank that finds its parent already gone at start exits (see ``pyrsia/shared/parent_death.py``)."""
ENV_RESUME = "PERSIA_RESUME"
"""Set to 1 by ``persia-launcher nn-worker|data-loader --resume``: start from the last checkpoint."""
ENV_METRICS_GATEWAY_ADDR = "PERSIA_METRICS_GATEWAY_ADDR"
"""host:port of a Prometheus push gateway (PERSIA's variable); pushing also needs enable_metrics."""
ENV_TENSORBOARD_DIR = "PERSIA_TENSORBOARD_DIR"
"""Where TrainCtx writes TensorBoard scalars (``<dir>/<job id>/rank_<r>``) when
``tensorboard_dir=`` is not given; unset or empty: none written."""
ENV_NATS_URLS = ("PERSIA_NATS_URL", "PERSIA_NATS_IP")
"""PERSIA's service-discovery variables (NATS); Pyrsia uses Redis and says so when they are set."""
ENV_AUTH_TOKEN = "PERSIA_AUTH_TOKEN"
"""Shared token every route requires when set (pyrsia.shared.auth)."""
ENV_INSECURE = "PERSIA_INSECURE"
"""1 allows a server to listen on a non-loopback address without a token (``--insecure``)."""
MIN_AUTH_TOKEN_CHARS = 16
ENV_CPU_PRIORITY = "PERSIA_CPU_PRIORITY"
"""normal or background (SCHED_IDLE): a service's scheduling class (``--cpu-priority``; default
normal) and, in embedded mode, that of the engine threads (default background)."""
ENV_MALLOC_TUNING = "PERSIA_MALLOC_TUNING"
"""1 (default) or 0: whether a training process keeps freed heap memory for reuse
(pyrsia/shared/allocator.py)."""
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20
"""Blocks below this come from the heap, not from mmap (glibc's maximum on 64-bit)."""
MALLOC_TRIM_THRESHOLD_BYTES = 256 << 20
"""Free memory at the top of the heap is handed back to the kernel only past this."""
ENV_EMBEDDED = "PERSIA_EMBEDDED"
"""1: embedded mode, the embedding PS and worker engines and the data loader inside the
NN-worker process (``persia-launcher run --embedded``; pyrsia/services/embedded/job.py);
0 or unset: services mode."""
ENV_PS_THREADS = "PYRSIA_PS_THREADS"
"""Threads one embedding PS replica works a batch's internal shards with, 1 to 64
(``--threads``; default: the cores the process may run on, at most 64)."""
ENV_CHECKPOINT_ROOT = "PERSIA_CHECKPOINT_ROOT"
"""The directory a PS's /dump and /load paths must lie in (``--checkpoint-root``); unset or
empty: any path the PS process can write."""

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_JOB_ID = "default"

# --- registry (Redis) ------------------------------------------------------------------
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
ENV_WAIT_TIMEOUT_S = "PERSIA_WAIT_TIMEOUT_S"
"""Seconds every process of this job waits for the services it needs to register (and for
Redis at start-up) before it gives up with one line naming what is missing; unset: each
wait's own default (120 s for the replicas, 3 s for Redis)."""
WAIT_REPORT_INTERVAL_S = 5.0
"""A process waiting for Redis or for replicas says what it waits for this often."""
ENV_ALLOW_UNKNOWN_CONFIG_KEYS = "PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS"
"""1: a key of embedding_config.yml or global_config.yml this version does not know is a
warning and ignored (for a file written for a newer version), as with
``--allow-unknown-config-keys``; by default it is an error naming the closest known key."""
ENV_VERBOSE = "PERSIA_VERBOSE"
"""1: a known error (Redis unreachable, a service never registered, a bad config) in a
user script run by ``persia-launcher`` shows its traceback too, as with ``LOG_LEVEL=debug``;
else it is one line (``--verbose`` sets it)."""

ENV_LOG_DIR = "PERSIA_LOG_DIR"
"""The folder where a process that ends on an error writes its traceback (``<process>.log``)
and, under ``persia-launcher run``, its failure record, so that ``run`` names the process
that failed first (``pyrsia/shared/failure_report.py``); unset: ``persia-<job id>`` in the
system's temporary folder."""
ENV_PROCESS = "PERSIA_PROCESS"
"""Set by the launchers that run a user script (``nn_worker/<rank>``, ``data_loader/<i>``):
the name the script's process reports errors under. Unset, the script was started by hand
(``python train.py``)."""

# --- roles -----------------------------------------------------------------------------
ROLE_EMBEDDING_PS = "embedding_parameter_server"
ROLE_EMBEDDING_WORKER = "embedding_worker"
ROLE_NN_WORKER = "nn_worker"
ROLE_NN_WORKER_NODE = "nn_worker_node"
"""A ``persia-launcher nn-worker`` process (one per node): a slot of the job lease only."""
ROLE_DATA_LOADER = "data_loader"
"""A ``persia-launcher data-loader`` process: a slot of the job lease only."""

# --- wire --------------------------------------------------------------------------------
MSGPACK_CONTENT_TYPE = "application/msgpack"
NDARRAY_EXT_CODE = 42
MAX_MESSAGE_BYTES = 1 << 30
"""Largest request or response body a service accepts (1 GiB; ``PYRSIA_MAX_MESSAGE_BYTES``)."""
ENV_MAX_MESSAGE_BYTES = "PYRSIA_MAX_MESSAGE_BYTES"
MAX_ARRAY_DIMS = 8
ENV_MAX_INFLIGHT_REQUEST_BYTES = "PYRSIA_MAX_INFLIGHT_REQUEST_BYTES"
"""Request-body bytes a service holds at once (default: see ``INFLIGHT_BYTES_CAPS``)."""
INFLIGHT_BYTES_CAPS = 2
"""Default in-flight bound: this many per-request caps (two largest bodies, or any mix) ..."""
INFLIGHT_BYTES_MEMORY_SHARE = 8
"""... but at most 1/this of physical memory, and never less than one per-request cap."""
INFLIGHT_BYTES_WAIT_S = 1.0
"""How long a request waits for room under the in-flight bound before its 503."""
INFLIGHT_BYTES_RETRY_AFTER_S = 1
"""``Retry-After`` (seconds) of that 503."""
ENV_BODY_TIMEOUT_S = "PYRSIA_BODY_TIMEOUT_S"
BODY_TIMEOUT_S = 30.0
"""Longest gap in a request body, and the grace before ``BODY_MIN_RATE`` applies."""
BODY_MIN_RATE = 1 << 20
"""Least average rate (bytes/s) of a request body once its first ``BODY_TIMEOUT_S`` are over."""
ENV_HEADER_TIMEOUT_S = "PYRSIA_HEADER_TIMEOUT_S"
HEADER_TIMEOUT_S = 10.0
"""Longest a connection may take to send a request line and headers (from its first byte, or
from the accept) before the server closes it (``pyrsia.shared.http_connections``)."""
ENV_IDLE_TIMEOUT_S = "PYRSIA_IDLE_TIMEOUT_S"
IDLE_TIMEOUT_S = 75.0
"""Longest a keep-alive connection may sit idle between requests before the server closes it."""
ENV_MAX_CONNECTIONS = "PYRSIA_MAX_CONNECTIONS"
MAX_CONNECTIONS_CAP = 4096
"""Default bound on one service's connections: half its file-descriptor limit, at most this."""

# --- HTTP --------------------------------------------------------------------------------
DEFAULT_BIND_HOST = "127.0.0.1"
ENV_BIND_HOST = "PERSIA_BIND_HOST"
"""The address a service binds (``--host`` wins; 0.0.0.0 in containers)."""
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

INLINE_WORK_MAX_IDS = 16384
"""PS: numeric work on at most this many ids runs on the event loop (~2 ms at the PS's
~0.14 µs per id); larger batches go to the service's thread pool so /health keeps
answering. A thread hand-off costs more CPU than the kernels of a small batch
(pyrsia/shared/thread_offload.py)."""
EW_INLINE_WORK_MAX_IDS = 65536
"""The embedding worker's bound: its per-batch kernels cost ~14 ns per id (preprocessing;
pooling and backward ~3), so this is ~1 ms on the loop. A Census-Income batch (33,792 ids)
then stays on the loop: its three pool hand-offs per batch had cost ~0.6 CPU-ms and ~6
thread wake-ups, each taking a core from the NN worker's training step (issue 10)."""

AUTO_EMBEDDING_STALENESS = 8
"""The staleness bound of a training DataLoader given no ``embedding_staleness`` (per rank).
Without any bound the lookups of a rank whose gradients queue behind the servers read
embeddings that miss up to ``backward_buffer_size`` batches' updates (Census-Income: test AUC
0.0018-0.0024 below one PyTorch process, against 0.0005-0.0007 at 8; docs/concepts/staleness.md)."""

GRADIENT_BUFFER_FACTOR = 4
"""An embedding worker keeps at most forward_buffer_size x this many batches awaiting their
gradients (the last of the four in-flight limits: pyrsia/services/nn_worker/inflight.py)."""

# --- in-process runtime (train.py / data_loader.py) -------------------------------------
RUNTIME_STOP_TIMEOUT_S = 10.0
GIL_SWITCH_INTERVAL_S = 0.0005
"""The GIL switch interval a training process gets when it starts the runtime thread
(only if it still has Python's default, 5 ms): the training thread then waits at most
0.5 ms, not 5, for the GIL the loop thread holds while it decodes and sends. Census
e2e, quiet 2-core machine, same-run pairs: ratio 0.76-0.77 at 5 ms, 0.80-0.81 at 0.5 ms."""
PYTHON_DEFAULT_SWITCH_INTERVAL_S = 0.005
"""How long stopping the event-loop thread waits for it to end."""
RUNTIME_CLOSED_POLL_S = 1.0
"""A thread blocked on a runtime permit re-checks this often whether the runtime stopped."""
DATA_SEND_TIMEOUT_S = 600.0
"""How long one data-loader batch may wait on back-pressure before its send fails."""
RANK_STOP_NOTICE_TIMEOUT_S = 60.0
"""A rank whose training loop stopped early waits this long for the other ranks to hear it
(they learn it in their next per-step agreement: pyrsia/services/nn_worker/even_steps.py)."""
DATA_LOADER_LINGER_S = 60.0
"""A data loader whose NN workers have left lingers this long before exiting on its own.

Under a Procfile the SIGTERM that ends it comes when the NN-worker *process* exits, which
can be several seconds after its ranks deregistered (5 s lost that race on a loaded
machine: the loader exited first and was killed during its interpreter shutdown)."""
MASTER_ADDR_TTL_S = 3600.0
"""Lifetime of the torch.distributed master address rank 0 publishes in Redis."""

# --- default ports (Procfile / compose) -------------------------------------------------
DEFAULT_PS_PORT = 8888
DEFAULT_EMBEDDING_WORKER_PORT = 8887

# --- embedding checkpoints (PS /dump, serving artifacts) --------------------------------
EMBEDDING_CHECKPOINT_FORMAT = "pyrsia-embedding-checkpoint"
EMBEDDING_CHECKPOINT_VERSION = 1

# --- launchers, helpers and in-process observers: timeouts and intervals --------------
DATALOADER_TIMEOUT_MS = 1000 * 60 * 10
"""``persia.data.DataLoader``'s longest wait for the next batch (PERSIA's default, 10 min)."""
PROGRESS_INTERVAL_S = 1.0
"""How often ``persia-launcher run`` redraws its live progress line."""
PROGRESS_STOP_TIMEOUT_S = 5.0
"""How long ``run`` waits for its progress thread to end."""
CHILD_STOP_TIMEOUT_S = 20.0
"""Seconds a child of ``persia-launcher run`` gets between SIGTERM and SIGKILL."""
CHILD_POLL_S = 0.1
"""How often ``run`` looks whether a child has exited."""
REDIS_START_TIMEOUT_S = 10.0
"""How long ``run`` and ``PersiaServiceCtx`` wait for the redis-server they started to listen."""
REDIS_PROBE_TIMEOUT_S = 0.2
"""One connection attempt to a starting redis-server."""
REDIS_PROBE_INTERVAL_S = 0.05
"""The pause between two connection attempts to a starting redis-server."""
LOG_READER_JOIN_S = 2.0
"""How long a launcher waits for a stopped child's last output lines before writing its own."""
FAILURE_LINES_JOIN_S = 10.0
"""How long ``run`` waits for every child's last lines before it names the failed process."""
STATUS_SCRAPE_TIMEOUT_S = 3.0
"""``persia-launcher status``: how long one service's ``/metrics`` may take to answer."""
PROMETHEUS_TARGETS_INTERVAL_S = 5.0
"""``persia-launcher prometheus-targets``: seconds between two rewrites of the targets file."""
PROMETHEUS_REDIS_WAIT_S = 30.0
"""``prometheus-targets`` waits this long for Redis (under compose it may start alongside)."""
HELPER_READY_TIMEOUT_S = 60.0
"""How long ``PersiaServiceCtx`` waits for a service it started to answer ``/health``."""
HELPER_STOP_TIMEOUT_S = 10.0
"""Seconds a service ``PersiaServiceCtx`` started gets between SIGTERM and SIGKILL."""
HELPER_HEALTH_TIMEOUT_S = 2.0
"""One ``/health`` request of ``PersiaServiceCtx`` to a starting service."""
HELPER_HEALTH_POLL_S = 0.1
"""The pause between two ``/health`` requests of ``PersiaServiceCtx``."""
HB_LEAVE_BARRIER_S = 60.0
"""HybridBackend's context waits this long at its closing barrier for the other ranks."""
SERVE_WATCH_INTERVAL_S = 0.5
"""How often ``persia-launcher serve`` looks whether its private embedding worker still runs."""
SERVE_SCHEMA_TIMEOUT_S = 10.0
"""How long ``serve`` waits for an embedding worker's schema."""
PROGRESS_LINE_INTERVAL_S = 2.0
"""Seconds between two lines of one progress bar on a pipe (its first and last always show)."""
STALL_REPORT_S = 5.0
"""An HTTP attempt without an answer for this long is logged (a warning), and again every period."""
STALL_FIRST_REPORT_MAX_S = 30.0
"""The first report of a stalled HTTP attempt comes at most this long after it started."""
RATE_WINDOW_S = 1.0
"""Samples/s is the rate over the last window of at least this many seconds."""
STALLED_S = 10.0
"""Samples/s reads 0 once no step has finished for this long."""
PS_POLL_INTERVAL_S = 10.0
"""Seconds between two PS points of the TensorBoard curves."""
PS_SCRAPE_TIMEOUT_S = 2.0
"""How long one PS-curve poll waits for a replica's /metrics before leaving it out of that point."""
TENSORBOARD_FLUSH_INTERVAL_S = 1.0
"""How often the TensorBoard writer thread writes what was recorded (and flushes to disk)."""
RENDEZVOUS_TIMEOUT_S = 600
"""torch's static rendezvous default: how long a rank waits for the others to join."""
PS_INCREMENTAL_SCAN_INTERVAL_S = 10.0
"""How often an Infer PS looks for new incremental-update packets."""
SLOT_KEEPER_JOIN_SLACK_S = 1.0
"""Added to the slot keeper's own bounds when waiting for its thread to end (the thread sleeps
between heartbeats; stopping it wakes it)."""

# --- limits ------------------------------------------------------------------------------
MAX_BATCH_SIZE = 65535
"""PERSIA's largest batch (the wire's bound, and ``persia-launcher serve``'s default)."""
MAX_FEATURES = 4096
"""Most id-type (or dense) features one batch may carry."""
MAX_LOADERS = 1 << 16
"""Most data-loader replicas one job may have."""
MAX_GROUPS = 1024
"""Most dim groups one PS lookup or update may carry."""
MAX_DIM = 1 << 16
"""Largest embedding dimension a PS request may name."""
MAX_DECODE_DEPTH = 512
"""Deepest nesting of containers a msgpack body may have."""
MAX_HEAD_BYTES = 64 * 1024
"""Status line + headers of one HTTP answer, at most."""
MAX_ANSWER_BYTES = 1 << 32
"""An HTTP answer body beyond this (msgpack's own limit) is refused."""
HTTP_DNS_CACHE_TTL_S = 300
"""How long the aiohttp client session keeps a resolved host name."""
MAX_CHECKPOINT_WORKERS = 64
"""Most checkpoint threads a PS takes (``checkpointing_config.num_workers``)."""
MAX_INTERNAL_SHARDS = 64
"""More PS shards than this buy no parallelism on the machines Pyrsia targets."""
PS_PARALLEL_MIN_CORES = 4
"""A PS on fewer usable cores works on one thread unless told otherwise: on such a node it
shares its cores with the embedding worker, the NN worker and the loader, and a second PS
thread measured 12 % more PS CPU per batch and 0.93x the samples/s on 2 cores."""
PS_PARALLEL_MIN_IDS = 4096
"""A PS batch of fewer ids runs on the calling thread alone (``embedding_ps/parallel.py``):
handing work to another thread and waiting for it costs tens of microseconds."""
MAX_CACHED_SCHEMAS = 16
"""Embedding schemas whose batch layouts an embedding worker keeps."""
MAX_CACHED_LAYOUTS = 64
"""Batch layouts kept per schema."""
MAX_PENDING_CURVE_POINTS = 100_000
"""TensorBoard records kept while the writer falls behind; the oldest go first beyond."""
MIN_LITERAL_SECRET_CHARS = 4
"""A secret shorter than this is not replaced in free text (it would mangle ordinary words)."""
SERVE_MAX_BATCH = 1 << 24
"""Upper bound of the dynamic batch dimension recorded by torch.export."""
SERVE_MAX_INFLIGHT = 16
"""``persia-launcher serve``: predictions running at once; more get 429."""
SERVE_THREADS = 2
"""``persia-launcher serve``: threads running the dense model."""
HB_GRADIENT_SENDERS = 8
"""Gradient senders (``backward_workers``) of a HybridBackend rank's embedding session."""
HELPER_START_ATTEMPTS = 3
"""``PersiaServiceCtx`` tries this many ports before a service's start fails."""
