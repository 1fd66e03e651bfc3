"""Data loader of the feed-rate benchmark: the training split, in order, ``FEED_EPOCHS`` times.

Run by ``persia-launcher data-loader benchmarks/e2e/feed_data_loader.py`` from
``benchmarks/feed_rate.py``. Environment: ``E2E_DATA`` (the npz ``data.prepare`` wrote),
``E2E_BATCH`` (batch size, default 1024), ``FEED_EPOCHS`` (passes over the split, default
1: enough batches for a steady window at batch 8,192), ``E2E_MAX_STEPS`` (at most this
many batches in all; 0 = every pass).
"""

from __future__ import annotations

import itertools
import os

from data import load, persia_batches

from persia.ctx import DataCtx


def main() -> None:
    data = load(os.environ["E2E_DATA"])
    batch_size = int(os.environ.get("E2E_BATCH", "1024"))
    epochs = int(os.environ.get("FEED_EPOCHS", "1"))
    max_steps = int(os.environ.get("E2E_MAX_STEPS", "0")) or None
    batches = itertools.chain.from_iterable(
        persia_batches(data, "train", batch_size) for _ in range(epochs)
    )
    with DataCtx() as ctx:
        for batch in itertools.islice(batches, max_steps):
            ctx.send_data(batch)


if __name__ == "__main__":
    main()
