"""Load (or compile) every numba kernel before it is needed.

The kernels are compiled on first call and cached next to their modules
(``cache=True``). On a fresh checkout that first compile takes tens of seconds per
process, and several services starting at once would each pay it; ``python -m
pyrsia.services.warmup`` (``make test``, ``make demo``) pays it once. Even from the cache, the
first call of each kernel costs a process ~0.1-0.5 s of CPU, so each service also loads
its own kernels in a background thread as it starts (``pyrsia.shared.warming``): a job's
first training steps then do not pay it (they did: the first gradients reached the PS and
worker kernels seconds into the timed window of the end-to-end benchmark).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pyrsia.shared.embedding_spec import OptimizerSpec


def warm_ps(specs: Sequence[OptimizerSpec] | None = None) -> None:
    """Run a tiny workload through the PS engine, with each optimizer of ``specs`` (default:
    every kind; an embedded job warms only the one it registered)."""
    from pyrsia.services.embedding_ps.engine import EmbeddingStore
    from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, SGDSpec
    from pyrsia.shared.farmhash import farmhash64

    ids = np.arange(8, dtype=np.uint64)
    farmhash64(ids)
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


def warm_worker() -> None:
    """Run a tiny batch through the worker's preprocessing, pooling and gathering."""
    from pyrsia.services.embedding_worker.gathering import answer_embeddings, gather_backward
    from pyrsia.services.embedding_worker.pooling import pool_backward, pool_forward
    from pyrsia.services.embedding_worker.preprocess import prepare_batch
    from pyrsia.services.embedding_worker.routing import replica_lookups
    from pyrsia.shared.config import parse_embedding_config
    from pyrsia.shared.wire.batch import IDFeature, single_id_offsets

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
    tables = [(dim, np.ones((prepared.groups[dim].ids.shape[0], dim), np.float32))
              for dim, _ in plan.groups]  # fmt: skip
    gather_backward(prepared, plan, tables, (), 2.0, grads)


def warm_up() -> float:
    """Every kernel of every process kind (``make warm``); returns the seconds it took."""
    from pyrsia.shared.scatter import warm

    started = time.perf_counter()
    warm_ps()
    warm_worker()
    warm()
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"numba kernels ready ({warm_up():.1f}s)")
