"""The embedding worker: between the data loaders, the NN workers and the PS shards.

``persia-launcher embedding-worker --replica-index i --replica-size n`` (or
``python -m pyrsia.services.embedding_worker``, same flags) buffers the id features
data loaders send (``buffer``: ``forward_buffer_size``, oldest dropped first), answers
an NN worker's lookup of a buffered batch (``preprocess``: feature-index prefixing,
``hash_stack_config``, dedup and each id's PS shard; ``routing``: one request per shard
and the answers put back; ``pooling``: sum/raw pooling; ``gathering``: the gathered
answer), and turns pooled gradients back into
per-id gradients for the shards (PERSIA's data-flow steps 1, 4 and 7).

Threads of one embedding-worker process::

    event-loop thread (aiohttp on uvloop)          "ew" pool (Offloader)
    ─────────────────────────────────────          ──────────────────────────────
    POST /batch ──check, buffer the ids
    POST /lookup(_direct) ──preprocess, dedup ─┐
                                               └──> kernels: dedup, prefix, pool,
    ps_client: one request per (batch, shard)         scatter gradients (release
      <── vectors / ──> gradients (keep-alive)         the GIL; small batches inline)
    POST /gradients ──fan out to the shards
    GET /health, /metrics; registry heartbeat      metrics push thread (when configured)

Modules: ``main`` (command line), ``server`` (HTTP routes), ``handlers`` (every embedding
route's handler, for HTTP and in process), ``replica`` (the ``Worker``), ``buffer``,
``preprocess``, ``routing``, ``pooling``, ``gathering``, ``kernels``, ``ps_link`` (the
Worker's PS protocol), ``ps_client`` (it over HTTP).
"""
