"""PERSIA's ``persia.prelude``: the names its Python layer took from the Rust core, in Python.

PERSIA's prelude re-exported the Rust extension ``persia_core``. Pyrsia has no Rust core;
each name below is the Pyrsia class or function that does that job::

    PersiaCommonContext        the connection of a context (registry, embedding workers):
                               ``ctx.common_context`` of every BaseCtx
    PersiaTrainingBatch        pyrsia.services.nn_worker.batch.PersiaTrainingBatch (DataLoader's batches)
    _PersiaBatch               persia.embedding.data.PersiaBatch (it is its own data)
    OptimizerBase              persia.embedding.optim.Optimizer
    PersiaBatchDataChannel     a bounded in-process channel with a sender and a receiver
    check_pyarray_dtype_valid  the dtype check of non-id features and labels
    is_cuda_feature_available  whether CUDA can be used (torch sees a GPU)
    register_submodule         registers a module's submodules in ``sys.modules``

Not provided, because their job is done elsewhere in Pyrsia with no object a script
holds: ``Forward`` / ``Backward`` (``persia.data.DataLoader`` and ``TrainCtx.backward``),
``Tensor`` (DLPack capsules: batches hold numpy arrays and torch tensors),
``initialize_dataflow`` (``StreamingDataset`` registers this rank's ingress) and the
message queue server and client (HTTP between the services).
"""

from __future__ import annotations

import logging
import queue
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from persia.embedding.data import PersiaBatch as _PersiaBatch
from persia.embedding.optim import Optimizer as OptimizerBase
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.shared.errors import InvalidInputError, InvalidTypeError
from pyrsia.shared.wire.batch import DENSE_DTYPES, DENSE_EXPECTED

if TYPE_CHECKING:
    from pyrsia.services.nn_worker.session import Session

__all__ = [
    "OptimizerBase",
    "PersiaBatchDataChannel",
    "PersiaBatchDataReceiver",
    "PersiaBatchDataSender",
    "PersiaCommonContext",
    "PersiaTrainingBatch",
    "check_pyarray_dtype_valid",
    "is_cuda_feature_available",
    "register_submodule",
]

_logger = logging.getLogger(__name__)


def register_submodule(module: ModuleType, root_module_path: str) -> None:
    """Put every submodule of ``module`` (recursively) in ``sys.modules`` under ``root_module_path``."""
    for attr in dir(module):
        if attr.startswith("__"):
            continue
        obj = getattr(module, attr)
        if isinstance(obj, ModuleType):
            full_path = f"{root_module_path}.{attr}"
            if sys.modules.get(full_path) is obj:
                continue
            sys.modules[full_path] = obj
            register_submodule(obj, full_path)


def is_cuda_feature_available() -> bool:
    """True when CUDA can be used here (PERSIA: the core was built with CUDA)."""
    import torch

    return torch.cuda.is_available()


def check_pyarray_dtype_valid(array: np.ndarray, dtype: Any) -> None:
    """Raise ``TypeError`` unless ``array`` is a numpy array of ``dtype`` and that dtype is one a
    non-id feature or a label may have (bool, int8..int64, uint8, float32, float64)."""
    if not isinstance(array, np.ndarray):
        raise InvalidTypeError("array", "a numpy array", type(array).__name__)
    expected = np.dtype(dtype)
    if array.dtype != expected:
        raise InvalidTypeError(
            "array.dtype",
            str(expected),
            message=f"array dtype is {array.dtype}, expected {expected}",
        )
    if expected not in DENSE_DTYPES:
        raise InvalidTypeError(
            "dtype",
            DENSE_EXPECTED,
            message=f"dtype {expected} is not supported: expected {DENSE_EXPECTED}",
        )


class PersiaBatchDataSender:
    """The sending end of a :class:`PersiaBatchDataChannel` (``send`` blocks while it is full)."""

    def __init__(self, channel: queue.Queue):
        self._queue = channel

    def send(self, persia_batch: _PersiaBatch) -> None:
        if not isinstance(persia_batch, _PersiaBatch):
            raise InvalidTypeError("persia_batch", "a PersiaBatch", type(persia_batch).__name__)
        self._queue.put(persia_batch)


class PersiaBatchDataReceiver:
    """The receiving end of a :class:`PersiaBatchDataChannel`."""

    def __init__(self, channel: queue.Queue):
        self._queue = channel

    def receive(self, timeout_ms: int | None = None) -> _PersiaBatch:
        """The next batch; ``TimeoutError`` when none comes within ``timeout_ms``."""
        try:
            return self._queue.get(timeout=None if timeout_ms is None else timeout_ms / 1000)
        except queue.Empty:
            raise TimeoutError(f"no PersiaBatch within {timeout_ms} ms") from None


class PersiaBatchDataChannel:
    """A bounded in-process channel of :class:`PersiaBatch` es between two threads."""

    def __init__(self, buffer_size: int):
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise InvalidInputError("buffer_size", "a positive integer", buffer_size)
        self._queue: queue.Queue = queue.Queue(buffer_size)

    def get_sender(self) -> PersiaBatchDataSender:
        return PersiaBatchDataSender(self._queue)

    def get_receiver(self) -> PersiaBatchDataReceiver:
        return PersiaBatchDataReceiver(self._queue)


class PersiaCommonContext:
    """The connection of a context to the job's services (``ctx.common_context``).

    PERSIA's Rust ``PersiaCommonContext`` held the NATS publisher and the RPC clients. Here
    it holds a Pyrsia session (Redis registry + embedding-worker client), opened on first
    use, never in ``__init__``; the context that owns it closes it when its ``with`` ends
    (or call :meth:`close`). The methods PERSIA's scripts and tests call on it work:
    ``init_nats_publisher`` (connects; Pyrsia finds services through Redis),
    ``wait_servers_ready``, ``configure_embedding_parameter_servers``,
    ``get_embedding_size``, ``clear_embeddings``, ``get_embedding_worker_addr_list`` and
    ``wait_for_serving``.
    """

    def __init__(
        self,
        threadpool_worker_size: int = 10,
        replica_index: int = 0,
        replica_size: int = 1,
        device_id: int | None = None,
    ):
        self.threadpool_worker_size = threadpool_worker_size
        self.replica_index = replica_index
        self.replica_size = replica_size
        self.device_id = device_id
        self._session: Session | None = None
        self._borrowed: Any = None  # an EmbeddingCtx whose session this one uses

    @classmethod
    def _of(cls, ctx: Any) -> PersiaCommonContext:
        """The common context of an EmbeddingCtx: its own session, not a second one."""
        common = cls(ctx.threadpool_worker_size, device_id=ctx.device_id)
        common._borrowed = ctx
        return common

    @property
    def session(self) -> Session:
        if self._borrowed is not None:
            return self._borrowed.session
        if self._session is None:
            from persia._session_open import open_session
            from pyrsia.shared.settings import current

            # PERSIA's API: a common context built alone connects with this process's settings
            self._session = open_session(current())
        return self._session

    def close(self) -> None:
        """Release a session this object opened (a no-op when it borrows its context's)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _run(self, coro):
        return self.session.runtime.run(coro)

    def init_nats_publisher(self, world_size: int | None = None) -> None:
        """Connect to the registry and the embedding workers (PERSIA: the NATS publisher)."""
        self.session  # noqa: B018  (opens the connection)

    def wait_servers_ready(self) -> None:
        """Wait until every embedding worker and PS replica answers ready."""
        self._run(self.session.client.wait_ready())

    def wait_for_serving(self) -> None:
        """Same as :meth:`wait_servers_ready` (PERSIA's inference spelling)."""
        self.wait_servers_ready()

    def configure_embedding_parameter_servers(
        self,
        initialize_lower: float,
        initialize_upper: float,
        admit_probability: float,
        enable_weight_bound: bool,
        weight_bound: float,
    ) -> None:
        """Send initialization bounds, admit probability and weight bound to every PS
        (``enable_weight_bound=False`` sends weight bound 0: no clipping)."""
        from persia.embedding import EmbeddingConfig

        config = EmbeddingConfig(
            (initialize_lower, initialize_upper),
            admit_probability,
            weight_bound if enable_weight_bound else 0,
        )
        client = self.session.client
        self._run(client.wait_ready())
        self._run(client.configure(config.to_dict()))

    def get_embedding_size(self) -> list[int]:
        """Number of embedding entries on each PS replica."""
        return [s.entries for s in self._run(self.session.client.stats()).ps]

    def clear_embeddings(self) -> None:
        """Remove every embedding from every PS replica."""
        self._run(self.session.client.clear())

    def get_embedding_worker_addr_list(self) -> list[str]:
        """``host:port`` of the embedding workers this context talks to."""
        return [url.split("://", 1)[-1] for url in self.session.client.urls]
