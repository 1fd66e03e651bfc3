"""The PS's numba kernels loaded (or compiled) before its first request needs them.

Run in a background thread as the PS starts (``pyrsia.shared.warming``), by embedded mode
for the optimizer it registered, and by ``python -m pyrsia.services.warmup`` (every kernel
of every process kind, once, before the services start).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.parallel import split_positions
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, OptimizerSpec, SGDSpec
from pyrsia.shared.farmhash import farmhash64


def warm_ps(specs: Sequence[OptimizerSpec] | None = None) -> None:
    """Run a tiny workload through the PS engine, with each optimizer of ``specs`` (default:
    every kind; an embedded job warms only the one it registered)."""
    ids = np.arange(8, dtype=np.uint64)
    farmhash64(ids)
    split_positions(ids, 2)  # a store of several internal shards splits every batch
    if specs is None:
        specs = (
            SGDSpec(lr=0.1),
            SGDSpec(lr=0.1, momentum=0.9),
            AdagradSpec(),
            AdagradSpec(vectorwise_shared=True),
            AdamSpec(),
        )
    for spec in specs:
        store = EmbeddingStore(capacity=4, num_shards=1, optimizer=spec)
        store.lookup(ids, 2, train=True)
        store.lookup(ids, 2, train=False)
        store.update(ids[-4:], np.ones((4, 2), np.float32))
        store.close()
