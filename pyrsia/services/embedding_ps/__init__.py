"""The embedding parameter server: one shard of the embedding tables, trained asynchronously.

``persia-launcher embedding-parameter-server --replica-index i --replica-size n`` (or
``python -m pyrsia.services.embedding_ps``, same flags) holds the ids whose stable hash
modulo ``n`` is ``i``: ``capacity`` vectors in preallocated arenas, LRU eviction,
admission, the embedding optimizers (SGD, Adagrad, Adam) and its part of every
checkpoint. It answers the embedding workers' lookups and gradient updates over HTTP
(``server``; PROTOCOL.md) and registers itself in Redis.

Threads of one PS process::

    event-loop thread (aiohttp on uvloop)        "ps" pool (server.Offloader)
    ─────────────────────────────────────        ───────────────────────────────────
    POST /lookup, /update ──decode, check──┐
                                           └──> engine: hash probe, gather, optimizer
    GET /health, /metrics (always answer)       update, LRU touch (compiled kernels
    registry heartbeat (Redis lease)             release the GIL)
    incremental-packet scanner (Infer PS)             │ a batch of >= 4,096 ids, threads > 1:
    /dump, /load ──────────────────────────┐          └─> "ps-shard" pool: threads - 1 of them
                                           └──> "ps-checkpoint" pool: shard files
    metrics push thread (when configured)

Modules: ``main`` (command line), ``server`` (routes), ``ps_metrics`` (its Prometheus
metrics), ``engine`` (the store: hot path, configuration, counters) composing
``shard_set`` / ``shard`` / ``table`` (its rows), ``parallel`` (a batch's shards over the
``--threads`` threads: the calling one works a share too), ``store_stats`` (the store's snapshot for
/stats), ``bulk`` (the whole-row surface checkpoints use), ``kernels``, ``optimizers``,
``checkpoint*`` (dumps and loads), ``incremental`` / ``packets`` (online updates for
serving), ``persia_convert`` / ``persia_format`` (PERSIA's checkpoints).
"""
