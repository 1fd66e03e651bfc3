"""Limits: the largest batches, messages and tables a request may name, the work a service
does inline, and the bounds of the training pipeline."""

# --- work on the event loop, and the training pipeline's bounds -----------------------
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

# --- sizes ----------------------------------------------------------------------------
MAX_BATCH_SIZE = 65535
"""PERSIA's largest batch (the wire's bound, and ``persia-launcher serve``'s default)."""
MAX_FEATURES = 4096
"""Most id-type (or dense) features one batch may carry."""
MAX_LOADERS = 1 << 16
"""Most data-loader replicas one job may have."""
MAX_CARRIED_GRADIENTS = 64
"""Gradient bodies one ``/lookup`` may carry (an NN worker carries the few it holds)."""
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
MAX_ENTRIES_PER_SHARD = 2**31 - 2
"""Most entries one internal PS shard holds (its entry indices are int32)."""
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
MIN_AUTH_TOKEN_CHARS = 16
"""Shortest ``PERSIA_AUTH_TOKEN`` a service accepts."""
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
MAX_FINAL_SCRAPE_S = 3600
"""The longest ``PYRSIA_FINAL_SCRAPE_S`` an NN worker rank accepts (an hour)."""
