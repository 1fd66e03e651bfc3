"""Data loader of the end-to-end benchmark: sends the training split, in order, once.

Run by ``persia-launcher data-loader benchmarks/e2e/data_loader.py``. Environment:
``E2E_DATA`` (the npz ``data.prepare`` wrote), ``E2E_BATCH`` (batch size, default
1024), ``E2E_MAX_STEPS`` (send at most this many batches; 0 = all). Replica ``i`` of
``n`` sends batches ``i, i + n, ...``.
"""

from __future__ import annotations

import itertools
import os

from data import load, persia_batches

from persia.ctx import DataCtx
from persia.env import get_replica_index, get_replica_size


def main() -> None:
    data = load(os.environ["E2E_DATA"])
    batch_size = int(os.environ.get("E2E_BATCH", "1024"))
    max_steps = int(os.environ.get("E2E_MAX_STEPS", "0")) or None
    index, size = get_replica_index(), get_replica_size()
    mine = (b for i, b in enumerate(persia_batches(data, "train", batch_size)) if i % size == index)
    with DataCtx() as ctx:
        for batch in itertools.islice(mine, max_steps):
            ctx.send_data(batch)


if __name__ == "__main__":
    main()
