"""Processes: the in-process runtime, the launchers, the helpers and the in-process observers
(their timeouts and intervals), and the allocator's thresholds."""

# --- allocator (pyrsia/shared/allocator.py) -------------------------------------------
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20
"""Blocks below this come from the heap, not from mmap (glibc's maximum on 64-bit)."""
MALLOC_TRIM_THRESHOLD_BYTES = 256 << 20
"""Free memory at the top of the heap is handed back to the kernel only past this."""

# --- in-process runtime (train.py / data_loader.py) -----------------------------------
RUNTIME_STOP_TIMEOUT_S = 10.0
"""How long stopping the event-loop thread waits for it to end."""
GIL_SWITCH_INTERVAL_S = 0.0005
"""The GIL switch interval a training process gets when it starts the runtime thread
(only if it still has Python's default, 5 ms): the training thread then waits at most
0.5 ms, not 5, for the GIL the loop thread holds while it decodes and sends. Census
e2e, quiet 2-core machine, same-run pairs: ratio 0.76-0.77 at 5 ms, 0.80-0.81 at 0.5 ms."""
PYTHON_DEFAULT_SWITCH_INTERVAL_S = 0.005
"""Python's own GIL switch interval (``sys.getswitchinterval()`` of a fresh interpreter)."""
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

SIGNAL_NOTE_WAIT_S = 0.5
"""How long a rank leaving after SIGTERM waits for the thread that logs the signal's note (a
signal handler never logs itself: it may have interrupted a log write holding the stream)."""
