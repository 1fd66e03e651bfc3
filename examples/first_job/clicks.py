"""Synthetic clicks for the first-job tutorial: who clicked which item, made up but learnable.

Every user and every item has a hidden taste; a click is likelier the higher the two add
up, and two dense features (time of day, position on the page) nudge it. A model has to
learn one vector per user and per item to predict clicks well: the embedding tables' job.

``batches(first, count, ...)`` builds batches number ``first .. first + count - 1`` of a
stream; batch ``k`` is the same every time it is built (its own seed), so the data loader
and a re-run agree without a file on disk.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from persia.embedding.data import IDTypeFeatureWithSingleID, Label, NonIDTypeFeature, PersiaBatch

NUM_USERS = 500
NUM_ITEMS = 200
BATCH_SIZE = 128

_taste = np.random.default_rng(0)
USER_TASTE = _taste.normal(0.0, 1.5, NUM_USERS)
ITEM_TASTE = _taste.normal(0.0, 1.5, NUM_ITEMS)
DENSE_WEIGHT = np.array([0.8, -0.5])


def make_clicks(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``n`` samples: user ids, item ids (uint64), dense features (n, 2) and labels (n, 1)."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, NUM_USERS, n).astype(np.uint64)
    items = rng.integers(0, NUM_ITEMS, n).astype(np.uint64)
    dense = rng.normal(0.0, 1.0, (n, 2)).astype(np.float32)
    logit = USER_TASTE[users] + ITEM_TASTE[items] + dense @ DENSE_WEIGHT
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    return users, items, dense, labels.reshape(-1, 1)


def batches(
    first: int, count: int, *, step: int = 1, requires_grad: bool = True
) -> Iterator[PersiaBatch]:
    """Batches ``first, first + step, ...`` (``count`` of them); batch ``k`` is seeded by ``k``."""
    for k in range(first, first + count * step, step):
        users, items, dense, labels = make_clicks(seed=1000 + k, n=BATCH_SIZE)
        yield PersiaBatch(
            [IDTypeFeatureWithSingleID("user", users), IDTypeFeatureWithSingleID("item", items)],
            non_id_type_features=[NonIDTypeFeature(dense)],
            labels=[Label(labels)],
            requires_grad=requires_grad,
        )
