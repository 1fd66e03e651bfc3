"""Data loader of the Adult example: sends the UCI Adult training batches into the job.

Started by ``persia-launcher data-loader data_loader.py --replica-index i --replica-size n``.
Replica ``i`` of ``n`` sends batches ``i, i + n, i + 2n, ...`` of every epoch, so n
loaders together send each batch exactly once per epoch. When the script returns,
``DataCtx`` tells the NN workers this loader is done; once all loaders are done the
training loop's ``StreamingDataset`` ends by itself.

Environment knobs:
    EPOCHS           passes over the training set (default 1)
    MAX_TRAIN_STEPS  send at most this many batches from this loader (default: no cap)
"""

from __future__ import annotations

import itertools

from data_prep import env_int, load_adult, make_batches
from tqdm import tqdm

from persia.ctx import DataCtx
from persia.env import get_replica_index, get_replica_size
from persia.logger import get_logger
from persia.utils import setup_seed

logger = get_logger("data_loader")

BATCH_SIZE = 128


def main() -> None:
    setup_seed(3)
    epochs = env_int("EPOCHS", 1)
    max_steps = env_int("MAX_TRAIN_STEPS", 0) or None
    replica_index, replica_size = get_replica_index(), get_replica_size()
    train = load_adult("train")
    logger.info(
        f"data loader {replica_index}/{replica_size}: {len(train)} samples, "
        f"batch size {BATCH_SIZE}, {epochs} epoch(s)"
    )
    mine = (
        batch
        for _ in range(epochs)
        for i, batch in enumerate(make_batches(train, BATCH_SIZE))
        if i % replica_size == replica_index
    )
    with DataCtx() as ctx:
        for batch in tqdm(itertools.islice(mine, max_steps), desc="send batches"):
            ctx.send_data(batch)
    logger.info("all batches sent")


if __name__ == "__main__":
    main()
