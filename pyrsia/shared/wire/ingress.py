"""Request bodies of the batch ingress each NN-worker rank hosts (pyrsia/services/nn_worker/ingress.py).

::

    /ingress  IngressBatch  {"loader": int, "batch_id": int, "worker": int, "dense": DensePart}
    /done     LoaderDone    {"loader": int, "loader_count": int, "sent": int}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import as_dict, as_int, get
from pyrsia.shared.wire.batch import DensePart
from pyrsia.shared.wire.worker import MAX_LOADERS


@dataclass(frozen=True, eq=False)
class IngressBatch:
    """One batch's dense half, and the embedding worker (``worker``) holding its id half."""

    loader: int
    batch_id: int
    worker: int
    dense: DensePart

    @classmethod
    def from_wire(cls, body: Any) -> IngressBatch:
        body = as_dict(body, "body")
        return cls(
            loader=as_int(get(body, "loader"), "loader", min_value=0, max_value=MAX_LOADERS),
            batch_id=as_int(get(body, "batch_id"), "batch_id", min_value=0),
            worker=as_int(get(body, "worker"), "worker", min_value=0),
            dense=DensePart.from_wire(get(body, "dense"), "dense"),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "loader": self.loader,
            "batch_id": self.batch_id,
            "worker": self.worker,
            "dense": self.dense.to_wire(),
        }


@dataclass(frozen=True)
class LoaderDone:
    """A data loader is finished: it sent ``sent`` batches to this rank."""

    loader: int
    loader_count: int
    sent: int

    @classmethod
    def from_wire(cls, body: Any) -> LoaderDone:
        body = as_dict(body, "body")
        count = as_int(
            get(body, "loader_count"), "loader_count", min_value=1, max_value=MAX_LOADERS
        )
        loader = as_int(get(body, "loader"), "loader", min_value=0)
        if loader >= count:
            raise InvalidInputError("loader", f"an index below loader_count={count}", loader)
        return cls(loader, count, as_int(get(body, "sent"), "sent", min_value=0))

    def to_wire(self) -> dict[str, Any]:
        return {"loader": self.loader, "loader_count": self.loader_count, "sent": self.sent}
