"""``EmbeddingCtx`` and ``eval_ctx``: lookups, tensors, checkpoints (re-exported by :mod:`persia.ctx`)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from persia._base_ctx import BaseCtx, PreprocessMode, cnt_ctx
from persia._session_open import open_session
from persia.embedding import EmbeddingConfig
from persia.embedding.data import PersiaBatch
from pyrsia.services.nn_worker import dense_state as ckpt
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.precision import Precision
from pyrsia.services.nn_worker.session import Session
from pyrsia.shared.errors import InvalidInputError, InvalidTypeError, MisuseError

_logger = logging.getLogger("persia.ctx")


def _prepare_feature(
    persia_training_batch: PersiaTrainingBatch,
    preprocess_mode: PreprocessMode = PreprocessMode.TRAIN,
):
    """``(non_id_type_feature_tensors, embedding_tensors, label_tensors or None)`` of a batch,
    on the batch's device; embeddings require grad in TRAIN mode, labels are None in
    INFERENCE mode (PERSIA's ``persia.ctx._prepare_feature``; contexts call it through
    :meth:`EmbeddingCtx.prepare_features`)."""
    tensors = _batch_tensors(persia_training_batch, preprocess_mode, None)
    return tensors.non_id, tensors.model_tensors(), tensors.labels


def _batch_tensors(batch, preprocess_mode: PreprocessMode, device_id: int | None):
    """The batch's tensors on its device (else ``device_id``)."""
    if not isinstance(batch, PersiaTrainingBatch):
        raise InvalidTypeError(
            "batch",
            "a PersiaTrainingBatch",
            message=f"expected a PersiaTrainingBatch from persia.data.DataLoader or get_embedding_from_data, got {type(batch).__name__}",
        )
    if not isinstance(preprocess_mode, PreprocessMode):
        raise InvalidInputError("preprocess_mode", "a PreprocessMode", preprocess_mode)
    training = preprocess_mode == PreprocessMode.TRAIN
    want_labels = preprocess_mode != PreprocessMode.INFERENCE
    if want_labels and not batch.labels:
        raise InvalidInputError(
            "labels",
            f"at least one label in {preprocess_mode.name} mode (use PreprocessMode.INFERENCE for unlabeled batches)",
            [],
        )
    if training and not batch.trainable:
        raise InvalidInputError(
            "batch",
            "a batch looked up for training (requires_grad=True, inside TrainCtx)",
            "a batch without a gradient reference",
        )
    device = batch.device_id if batch.device_id is not None else device_id
    return batch.tensors(device, requires_grad=training, labels=want_labels)


class EmbeddingCtx(BaseCtx):
    """Embedding lookups and tensors for a model; checkpoints of model + embeddings.

    Arguments:
        preprocess_mode: what :meth:`prepare_features` produces (see PreprocessMode).
        model: the dense torch model, called as ``model(non_id_tensors, embedding_tensors)``.
        embedding_config: hyperparameters sent to the servers on enter; when None the
            servers keep theirs (PERSIA resets them to defaults, even inside TrainCtx).

    Entered inside another context (``eval_ctx(model=model)`` inside a TrainCtx, as
    PERSIA's examples evaluate), it shares that context's connection and, when it has no
    ``device_id`` of its own, its device while it is entered.
    """

    def __init__(
        self,
        preprocess_mode: PreprocessMode,
        model: torch.nn.Module | None = None,
        embedding_config: EmbeddingConfig | None = None,
        *args,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if not isinstance(preprocess_mode, PreprocessMode):
            raise InvalidInputError("preprocess_mode", "a PreprocessMode", preprocess_mode)
        if model is not None and not isinstance(model, torch.nn.Module):
            raise InvalidTypeError(
                "model",
                "a torch.nn.Module",
                message=f"model: expected a torch.nn.Module, got {type(model).__name__}",
            )
        if embedding_config is not None and not isinstance(embedding_config, EmbeddingConfig):
            raise InvalidTypeError(
                "embedding_config",
                "persia.embedding.EmbeddingConfig",
                message=f"embedding_config: expected persia.embedding.EmbeddingConfig, got {type(embedding_config).__name__}",
            )
        self.preprocess_mode = preprocess_mode
        self.model = model
        self.embedding_config = embedding_config
        self.current_batch: PersiaTrainingBatch | None = None
        self._current_embeddings: list[tuple[str, torch.Tensor]] = []
        self._session: Session | None = None
        self._owns_session = False
        self._forward_precision = Precision(False, self.device_id)
        self._pending: dict[str, Any] = {}
        self._device_inherited = False  # device_id taken from the enclosing context (_enter)

    @property
    def _precision(self) -> Precision:
        """Autocast of :meth:`forward`: full precision here; a TrainCtx's training step's."""
        return self._forward_precision

    # --- connection ---------------------------------------------------------------------
    def _open_session(self) -> Session:
        return open_session(self.settings)

    def _enter(self) -> None:
        parent = cnt_ctx()
        if (
            isinstance(parent, EmbeddingCtx)
            and parent._session is not None
            and type(self) is EmbeddingCtx
        ):
            self.close()  # a connection opened before `with` gives way to the parent's
            self._session, self._owns_session = parent._session, False
            if self.device_id is None and parent.device_id is not None:
                # PERSIA's examples evaluate with eval_ctx(model=model) inside a TrainCtx on a
                # GPU, without a device_id: the batches go where the parent's go
                self.device_id, self._device_inherited = parent.device_id, True
            parent._before_nested()
        elif self._session is None:
            self._session, self._owns_session = self._open_session(), True
        if self.embedding_config is not None:
            self.configure_embedding_parameter_servers(self.embedding_config)

    def _before_nested(self) -> None:
        """Hook run when a context is entered inside this one (TrainCtx flushes gradients)."""

    def _exit(self, failed: bool) -> None:
        if self._device_inherited:
            self.device_id, self._device_inherited = None, False
        session, self._session = self._session, None
        if session is not None and self._owns_session:
            session.close(final_scrape=not failed)

    @property
    def session(self) -> Session:
        """The context's connection; opened on first use when the context is not entered.

        PERSIA's contexts connect in ``__init__``, so their query methods (``get_embedding_size``,
        ``dump_checkpoint``, ``wait_for_serving``, ...) work without ``with`` and after it ends;
        its TorchServe handler never enters ``InferCtx``. Pyrsia keeps ``__init__`` free of
        network work and connects here instead; :meth:`close` (or the end of a later ``with``)
        releases such a connection.
        """
        if self._session is None:
            self._session, self._owns_session = self._open_session(), True
            _logger.debug("%s: connected outside a `with` block", type(self).__name__)
        return self._session

    def register_embedding_optimizer(self, optimizer: dict[str, Any]) -> None:
        """Register ``optimizer`` with every PS replica, through :attr:`session`."""
        session = self.session
        session.runtime.run(session.client.register_optimizer(optimizer))

    @property
    def common_context(self):
        """A :class:`persia.prelude.PersiaCommonContext` over this context's own connection."""
        if self._common_context is None:
            from persia.prelude import PersiaCommonContext

            self._common_context = PersiaCommonContext._of(self)
        return self._common_context

    def close(self) -> None:
        """Release a connection opened outside ``with`` (a no-op when there is none)."""
        if self._entered:
            raise MisuseError(f"{type(self).__name__} is entered: it closes when its `with` ends")
        session, self._session = self._session, None
        if session is not None and self._owns_session:
            session.close()

    def _run(self, coro):
        return self.session.runtime.run(coro)

    def configure_embedding_parameter_servers(self, embedding_config: EmbeddingConfig) -> None:
        """Send initialization bounds, admit probability and weight bound to every PS."""
        if not isinstance(embedding_config, EmbeddingConfig):
            raise InvalidTypeError(
                "embedding_config",
                "persia.embedding.EmbeddingConfig",
                message="embedding_config: expected persia.embedding.EmbeddingConfig",
            )
        client = self.session.client
        self._run(client.wait_ready())
        self._run(client.configure(embedding_config.to_dict()))

    # --- batches and tensors ------------------------------------------------------------
    def get_embedding_from_data(
        self, persia_batch: PersiaBatch, device_id: int | None = None
    ) -> PersiaTrainingBatch:
        """Look the batch's embeddings up directly (no data loader in between)."""
        if not isinstance(persia_batch, PersiaBatch):
            raise InvalidTypeError(
                "persia_batch",
                "a PersiaBatch",
                message=f"persia_batch: expected a PersiaBatch, got {type(persia_batch).__name__}",
            )
        train = self.preprocess_mode == PreprocessMode.TRAIN and persia_batch.requires_grad
        answer, worker = self._run(self.session.client.lookup_direct(persia_batch.id_part(), train))
        return PersiaTrainingBatch(
            persia_batch.dense_part(),
            answer.embeddings,
            persia_batch.requires_grad,
            worker=worker if answer.batch_id is not None else None,
            batch_id=answer.batch_id,
            device_id=device_id if device_id is not None else self.device_id,
        )

    def get_embedding_from_bytes(
        self, data: bytes, device_id: int | None = None
    ) -> PersiaTrainingBatch:
        """:meth:`get_embedding_from_data` of ``PersiaBatch.to_bytes()`` output."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidTypeError(
                "data",
                "bytes from PersiaBatch.to_bytes()",
                message=f"data: expected bytes from PersiaBatch.to_bytes(), got {type(data).__name__}",
            )
        return self.get_embedding_from_data(PersiaBatch.from_bytes(bytes(data)), device_id)

    def prepare_features(self, persia_training_batch: PersiaTrainingBatch):
        """``(non_id_type_feature_tensors, embedding_tensors, label_tensors or None)``."""
        batch = persia_training_batch
        tensors = _batch_tensors(batch, self.preprocess_mode, self.device_id)
        self._current_embeddings = tensors.embeddings
        self.current_batch = batch
        return tensors.non_id, tensors.model_tensors(), tensors.labels

    def forward(self, batch: PersiaTrainingBatch):
        """``prepare_features`` then ``model(non_id_tensors, embedding_tensors)``: ``(output, labels)``."""
        if self.model is None:
            raise MisuseError(f"{type(self).__name__} has no model: pass model=... to the context")
        non_id, embeddings, labels = self.prepare_features(batch)
        with self._precision.autocast():
            output = self.model(non_id, embeddings)
        ok = isinstance(output, torch.Tensor) or (
            isinstance(output, (tuple, list))
            and output
            and all(isinstance(o, torch.Tensor) for o in output)
        )
        if not ok:
            raise InvalidTypeError(
                "model output",
                "a torch.Tensor (or a tuple/list of tensors)",
                message=f"the model returned {type(output).__name__}: expected a torch.Tensor (or a tuple/list of tensors)",
            )
        return self._precision.to_full(output), labels

    # --- embeddings on the servers ------------------------------------------------------
    def get_embedding_size(self) -> list[int]:
        """Number of embedding entries held by each PS replica."""
        return [s.entries for s in self._run(self.session.client.stats()).ps]

    def clear_embeddings(self) -> None:
        """Remove every embedding (and optimizer state) from every PS replica."""
        self._run(self.session.client.clear())

    def _admin_async(self, kind: str, coro_fn, directory: str, blocking: bool) -> None:
        self.wait_for_dump_embedding() if kind == "dump" else self.wait_for_load_embedding()
        future = self.session.runtime.submit(coro_fn(os.path.abspath(directory)))
        self._pending[kind] = future
        if blocking:
            self._wait(kind)

    def _wait(self, kind: str) -> None:
        future = self._pending.pop(kind, None)
        if future is not None:
            with self.session.runtime.waiting_on_loop():
                future.result()

    def dump_embedding(self, dst_dir: str, blocking: bool = True) -> None:
        """Every PS replica writes its shard to ``dst_dir`` (see :meth:`wait_for_dump_embedding`)."""
        self._admin_async("dump", self.session.client.dump, dst_dir, blocking)

    def load_embedding(self, src_dir: str, blocking: bool = True) -> None:
        """Every PS replica loads the ids routed to it from ``src_dir``."""
        if not os.path.isdir(src_dir):
            raise FileNotFoundError(f"{src_dir}: no such embedding checkpoint directory")
        self._admin_async("load", self.session.client.load, src_dir, blocking)

    def wait_for_dump_embedding(self) -> None:
        """Wait for a ``dump_embedding(blocking=False)``; its error is raised here."""
        self._wait("dump")

    def wait_for_load_embedding(self) -> None:
        """Wait for a ``load_embedding(blocking=False)``; its error is raised here."""
        self._wait("load")

    # --- dense state and checkpoints ----------------------------------------------------
    def dump_torch_state_dict(
        self, torch_instance, dst_dir: str, file_name: str, is_jit: bool = False
    ) -> None:
        """Save a model's or optimizer's state dict (or a TorchScript model) as ``dst_dir/file_name``."""
        ckpt.save_state(torch_instance, os.path.join(dst_dir, file_name), is_jit=is_jit)

    def load_torch_state_dict(self, torch_instance, src_dir: str, map_location=None) -> None:
        """Load a state dict file (``src_dir`` is the file's path, as in PERSIA) into the instance."""
        ckpt.load_state(torch_instance, src_dir, map_location=map_location)

    def _writer(self) -> bool:
        return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0

    def _barrier(self) -> None:
        """Collective; for code every rank runs (periodic checkpoints), not dump_checkpoint."""
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def dump_checkpoint(
        self,
        dst_dir: str,
        dense_filename: str = "dense.pt",
        jit_dense_filename: str = "jit_dense.pt",
        blocking: bool = True,
        with_jit_model: bool = False,
    ) -> None:
        """Dense model state (rank 0) and every embedding shard into ``dst_dir``.

        Not collective (PERSIA's examples call it on rank 0 only): other ranks return at once.
        """
        if self.model is None:
            raise MisuseError("dump_checkpoint needs the context's model: pass model=...")
        if self._writer():
            os.makedirs(dst_dir, exist_ok=True)
            if with_jit_model:
                self.dump_torch_state_dict(self.model, dst_dir, jit_dense_filename, is_jit=True)
            self.dump_torch_state_dict(self.model, dst_dir, dense_filename)
            self.dump_embedding(dst_dir, blocking=blocking)

    def load_checkpoint(
        self,
        src_dir: str,
        map_location=None,
        dense_filename: str = "dense.pt",
        blocking: bool = True,
    ) -> None:
        """Load the dense model (calling rank) and embeddings (rank 0); not collective either."""
        if self.model is None:
            raise MisuseError("load_checkpoint needs the context's model: pass model=...")
        if not os.path.isdir(src_dir):
            raise FileNotFoundError(f"{src_dir}: no such checkpoint directory")
        dense_path = os.path.join(src_dir, dense_filename)
        if os.path.exists(dense_path):
            self.load_torch_state_dict(self.model, dense_path, map_location=map_location)
        else:
            _logger.warning("%s not found: dense model not restored", dense_path)
        if self._writer():
            self.load_embedding(src_dir, blocking=blocking)


def eval_ctx(*args, **kwargs) -> EmbeddingCtx:
    """An :class:`EmbeddingCtx` in EVAL mode (nested in TrainCtx it shares its connection)."""
    return EmbeddingCtx(PreprocessMode.EVAL, *args, **kwargs)
