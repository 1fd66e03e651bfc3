"""Compile and cache every numba kernel once: ``python -m services.warmup``.

The kernels are compiled on first call and cached next to their modules
(``cache=True``). On a fresh checkout that first compile takes tens of seconds per
process, and several services starting at once would each pay it; running this once
before the services start (``make test``, ``make demo``) pays it once.
"""

from __future__ import annotations

import time

import numpy as np


def warm_up() -> float:
    """Run a tiny workload through the PS engine (every optimizer) and the worker core."""
    from services.embedding_ps.engine import EmbeddingStore
    from services.embedding_worker.pooling import pool_backward, pool_forward, replica_lookups
    from shared.config import parse_embedding_config
    from shared.embedding_spec import AdagradSpec, AdamSpec, SGDSpec
    from shared.farmhash import farmhash64

    started = time.perf_counter()
    ids = np.arange(8, dtype=np.uint64)
    farmhash64(ids)
    for spec in (
        SGDSpec(lr=0.1),
        SGDSpec(lr=0.1, momentum=0.9),
        AdagradSpec(),
        AdagradSpec(vectorwise_shared=True),
        AdamSpec(),
    ):
        store = EmbeddingStore(capacity=4, num_shards=1, optimizer=spec)
        store.lookup(ids, 2, train=True)
        store.lookup(ids, 2, train=False)
        store.update(ids[-4:], np.ones((4, 2), np.float32))
        store.close()

    schema = parse_embedding_config(
        {
            "slots_config": {
                "s": {"dim": 2},
                "q": {"dim": 2, "sqrt_scaling": True},
                "r": {"dim": 2, "embedding_summation": False, "sample_fixed_size": 2},
                "h": {"dim": 2, "hash_stack_config": {"hash_stack_rounds": 2, "embedding_size": 5}},
            }
        }
    )
    from services.embedding_worker.preprocess import prepare_batch
    from shared.wire.batch import IDFeature

    offsets = np.array([0, 1, 3], dtype=np.int64)
    feats = [IDFeature(name, ids[:3].copy(), offsets) for name in ("s", "q", "r", "h")]
    prepared = prepare_batch(schema, feats, 2)
    vectors = {
        dim: np.ones((g.ids.shape[0], dim), np.float32) for dim, g in prepared.groups.items()
    }
    replica_lookups(prepared)
    outs = pool_forward(prepared, vectors)
    pool_backward(prepared, [np.ones_like(o) for o in outs], 2.0)
    from shared.scatter import add_rows_if_finite

    index = np.array([0, 1, 0], dtype=np.int32)
    readonly = index.copy()
    readonly.setflags(write=False)  # what the wire decodes
    for idx in (index, readonly):
        add_rows_if_finite(idx, np.ones((3, 2), np.float32), np.zeros((2, 2), np.float32))
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"numba kernels ready ({warm_up():.1f}s)")
