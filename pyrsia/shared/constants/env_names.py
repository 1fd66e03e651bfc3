"""The names of the environment variables Pyrsia reads (``ENV_*``).

Only the settings and env modules read the environment (``pyrsia.shared.settings``,
``persia.env``); everything else gets the values passed down. ``docs/env_vars.py`` lists
these names, with their docstrings, in ``reference/environment.md``.
"""

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
ENV_CPU_PRIORITY = "PERSIA_CPU_PRIORITY"
"""normal or background (SCHED_IDLE): a service's scheduling class (``--cpu-priority``; default
normal) and that of the NN worker's loop thread while a training loop runs (in embedded mode
while a context is open, and of the data loader's thread; default background)."""
ENV_MALLOC_TUNING = "PERSIA_MALLOC_TUNING"
"""1 (default) or 0: whether a training process keeps freed heap memory for reuse
(pyrsia/shared/allocator.py)."""
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
ENV_WAIT_TIMEOUT_S = "PERSIA_WAIT_TIMEOUT_S"
"""Seconds every process of this job waits for the services it needs to register (and for
Redis at start-up) before it gives up with one line naming what is missing; unset: each
wait's own default (120 s for the replicas, 3 s for Redis)."""
ENV_FINAL_SCRAPE_S = "PYRSIA_FINAL_SCRAPE_S"
"""Seconds an NN worker rank, at the end of its job, keeps serving ``/metrics`` (and stays
in the registry) until a scrape that starts after the end has been answered, so Prometheus
records the final counters of a job shorter than a few scrape intervals; unset or 0: the rank
stops at once. A number from 0 to 3600."""
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
ENV_MAX_MESSAGE_BYTES = "PYRSIA_MAX_MESSAGE_BYTES"
ENV_MAX_INFLIGHT_REQUEST_BYTES = "PYRSIA_MAX_INFLIGHT_REQUEST_BYTES"
"""Request-body bytes a service holds at once (default: see ``INFLIGHT_BYTES_CAPS``)."""
ENV_BODY_TIMEOUT_S = "PYRSIA_BODY_TIMEOUT_S"
ENV_HEADER_TIMEOUT_S = "PYRSIA_HEADER_TIMEOUT_S"
ENV_IDLE_TIMEOUT_S = "PYRSIA_IDLE_TIMEOUT_S"
ENV_MAX_CONNECTIONS = "PYRSIA_MAX_CONNECTIONS"
ENV_BIND_HOST = "PERSIA_BIND_HOST"
"""The address a service binds (``--host`` wins; 0.0.0.0 in containers)."""
