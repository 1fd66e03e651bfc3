"""Embedded mode's room: the embedding PS and embedding-worker engines composed in the NN
worker's process (``PERSIA_EMBEDDED=1``, ``persia-launcher run --embedded``).

The only package that imports the engines of other services: ``transport`` (the in-process
embedding transport: the engines answering the embedding routes), ``local_ps`` (the PS engine
behind the worker's PS interface), ``client`` (the NN worker's embedding client over that
transport), ``job`` (the process's engines, its data-loader thread and its session),
``sender`` (the data loader's batches handed over in process), ``mode`` (whether
a job asked for embedded mode; no engine imports) and ``kernel_warmup`` (every kernel of every
process kind, ``python -m pyrsia.services.warmup``). The contexts reach it through one seam,
``persia._session_open``; importing this package alone loads no engine.
"""
