"""The embedding worker's numba kernels loaded (or compiled) before its first batch needs them.

Run in a background thread as the worker starts (``pyrsia.shared.warming``), by embedded
mode, and by ``python -m pyrsia.services.warmup`` (every kernel of every process kind, once,
before the services start).
"""

from __future__ import annotations

import numpy as np

from pyrsia.services.embedding_worker.gathering import answer_embeddings, gather_backward
from pyrsia.services.embedding_worker.pooling import pool_backward, pool_forward
from pyrsia.services.embedding_worker.preprocess import prepare_batch
from pyrsia.services.embedding_worker.routing import replica_lookups
from pyrsia.shared.config import parse_embedding_config
from pyrsia.shared.wire.batch import IDFeature, single_id_offsets


def warm_worker() -> None:
    """Run a tiny batch through the worker's preprocessing, pooling and gathering."""
    schema = parse_embedding_config(
        {
            "slots_config": {
                "s": {"dim": 2},
                "q": {"dim": 2, "sqrt_scaling": True},
                "r": {"dim": 2, "embedding_summation": False, "sample_fixed_size": 2},
                "h": {"dim": 2, "hash_stack_config": {"hash_stack_rounds": 2, "embedding_size": 5}},
                "g": {"dim": 2},
            }
        }
    )
    ids = np.arange(8, dtype=np.uint64)
    offsets = np.array([0, 1, 3], dtype=np.int64)
    feats = [IDFeature(name, ids[:3].copy(), offsets) for name in ("s", "q", "r", "h")]
    feats.append(IDFeature("g", ids[:2].copy(), single_id_offsets(2)))
    prepared = prepare_batch(schema, feats, 2)
    vectors = {
        dim: np.ones((g.ids.shape[0], dim), np.float32) for dim, g in prepared.groups.items()
    }
    replica_lookups(prepared)
    outs = pool_forward(prepared, vectors)
    grads, _ = pool_backward(prepared, [np.ones_like(o) for o in outs], 2.0)
    _, plan = answer_embeddings(prepared, vectors, gathered=True)
    tables = [
        (dim, np.ones((prepared.groups[dim].ids.shape[0], dim), np.float32))
        for dim, _ in plan.groups
    ]
    gather_backward(prepared, plan, tables, (), 2.0, grads)
