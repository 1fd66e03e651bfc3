"""``TrainCtx``: the training context (re-exported by :mod:`persia.ctx`).

PERSIA's facade over :class:`pyrsia.services.nn_worker.step.TrainingStep`
(``ctx.training_step``), which holds the step and its public hooks. One training step,
as ``ctx.backward(loss)`` runs it::

    loss ──scale (GradScaler, CUDA fp16 only)──> backward()
         ├─ dense grads: averaged over the ranks by DDP when WORLD_SIZE > 1
         └─ embedding grads, per slot, same layout as the embeddings; each rank's are
            applied by the PS: summed over the ranks (embedding_grad_reduction="sum",
            PERSIA's) or each divided by WORLD_SIZE first ("mean")
              every `embedding_gradient_check_frequency` steps: all finite?
                 no  -> skip this embedding update, shrink the loss scale
              -> BackwardEngine (<= backward_buffer_size in flight) -> embedding worker
    dense optimizer step (through the scaler when there is one); zero grads
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from persia import env
from persia._base_ctx import PreprocessMode, cnt_ctx
from persia._embedding_ctx import EmbeddingCtx
from persia._train_args import check_args, check_loss, warn_no_effect
from persia._train_parts import TrainParts, extended_step
from persia._train_report import RankReport
from persia.distributed import DistributedBaseOption, get_default_distributed_option
from persia.embedding import get_default_embedding_config
from persia.embedding.optim import Optimizer
from pyrsia.services.nn_worker.backward import BackwardEngine
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.checkpointer import PeriodicCheckpointer
from pyrsia.services.nn_worker.inflight import InflightLimits
from pyrsia.services.nn_worker.precision import Precision
from pyrsia.services.nn_worker.rank_stats import RankStats
from pyrsia.services.nn_worker.step import HookHandle
from pyrsia.services.nn_worker.step_clock import StepClock
from pyrsia.services.nn_worker.termination import SIGTERM_DRAIN_S
from pyrsia.shared import job_checkpoint
from pyrsia.shared.allocator import keep_freed_memory
from pyrsia.shared.constants import DEFAULT_WAIT_TIMEOUT_S
from pyrsia.shared.errors import MisuseError
from pyrsia.shared.scatter import warm_in_background
from pyrsia.shared.validate import positive_int

_logger = logging.getLogger("persia.ctx")


class TrainCtx(EmbeddingCtx):
    """Trains the dense model (synchronously, data parallel) and the embeddings (asynchronously).

    Arguments:
        embedding_optimizer: a ``persia.embedding.optim`` optimizer, applied on the servers.
        dense_optimizer: the torch optimizer of ``model``'s parameters.
        grad_scalar_update_factor: the loss scale is divided by this when embedding
            gradients are not finite (> 0).
        backward_buffer_size: most batches whose gradients are still being sent.
        backward_workers_size: most gradient requests on the wire at once.
        grad_update_buffer_size: accepted, no effect: gradients are copied before they are
            sent, so no tensor references are held (a value other than PERSIA's 60 logs a
            warning; the bound on batches in flight is ``backward_buffer_size``).
        lookup_emb_directly: accepted, no effect: direct lookups always work (False logs a
            warning).
        mixed_precision: fp16 autocast + loss scaling on CUDA; bf16 autocast on the CPU.
        distributed_option: how to wrap the model when WORLD_SIZE > 1 (default: DDP,
            nccl on GPU, gloo on CPU).
        epl_config: a ``persia.epl.Config`` of EPL training options (default: the one given
            to ``persia.epl.init``, if any); see the README's EPL section. EPL returns the
            model, dense optimizer, distributed option and precision this context trains
            with (``persia._train_parts``); ``epl_plan`` keeps what it did.
        embedding_grad_reduction: how the ranks' embedding gradients combine on the PS.
            ``"sum"`` (default, PERSIA's behaviour: every rank sends its own batch's
            gradients and the PS applies each of them, rust/persia-core/src/backward.rs),
            so with N ranks an id seen by every rank moves N times as far as with one,
            while the dense gradients are averaged by DDP. ``"mean"`` divides each rank's
            embedding gradients by the world size before they are applied (through the
            loss scale the worker divides by), so embeddings and dense layers both follow
            the mean over the ranks, as HybridBackend does for its sharded embeddings
            (``GradientAggregation._reduce``, hybridbackend/tensorflow/training/
            optimizer_lib.py). With SGD without weight decay, ``"mean"`` is ``"sum"``
            with the embedding learning rate divided by N; with weight decay, Adagrad or
            Adam the two differ by more than a rate. Refused unless "sum" or "mean".
        tensorboard_dir: write TensorBoard scalars (loss, samples/s, staleness, lookup wait,
            step phases; ``log_scalar`` for eval metrics) to ``<dir>/<PERSIA_JOB_ID>/rank_<r>``
            (default: ``$PERSIA_TENSORBOARD_DIR``; None and unset: no curves). Tags:
            ``pyrsia.services.nn_worker.tensorboard``.
        log_every_n_steps: the loss is sampled (kept for the curves and ``/metrics``) every
            this many steps (default 1: a TensorBoard point per step); reading it is done off
            the training thread.
        model, device_id, embedding_config, threadpool_worker_size: as for EmbeddingCtx.
    """

    def __init__(
        self,
        embedding_optimizer: Optimizer | None = None,
        dense_optimizer: torch.optim.Optimizer | None = None,
        grad_scalar_update_factor: float = 4,
        backward_buffer_size: int = 10,
        backward_workers_size: int = 8,
        grad_update_buffer_size: int = 60,
        lookup_emb_directly: bool = True,
        mixed_precision: bool = True,
        distributed_option: DistributedBaseOption | None = None,
        *args,
        epl_config: Any = None,
        embedding_grad_reduction: str = "sum",
        tensorboard_dir: str | os.PathLike | None = None,
        log_every_n_steps: int = 1,
        **kwargs,
    ):
        super().__init__(PreprocessMode.TRAIN, *args, **kwargs)
        check_args(
            embedding_optimizer,
            dense_optimizer,
            self.model,
            grad_scalar_update_factor,
            embedding_grad_reduction,
            distributed_option,
            lookup_emb_directly,
        )
        self.embedding_optimizer = embedding_optimizer
        self.grad_scalar_update_factor = float(grad_scalar_update_factor)
        self.embedding_grad_reduction = embedding_grad_reduction
        self.inflight = InflightLimits(  # the bounds on work in flight (inflight.py)
            backward_buffer=backward_buffer_size, backward_workers=backward_workers_size
        )
        self.backward_buffer_size = self.inflight.backward_buffer
        self.backward_workers_size = self.inflight.backward_workers
        warn_no_effect(grad_update_buffer_size, lookup_emb_directly)
        self.mixed_precision = bool(mixed_precision)
        self.embedding_config = self.embedding_config or get_default_embedding_config()
        self.world_size = 1
        self.rank_id = 0
        precision = Precision(self.mixed_precision, self.device_id)
        parts = TrainParts(
            self.model, dense_optimizer, distributed_option, precision, self.device_id
        )
        # training_step: what ``backward`` runs; ``training_step.add_hook(point, fn)`` extends it
        self.epl_plan, parts, self.training_step = extended_step(
            parts, epl_config, self.grad_scalar_update_factor
        )
        self.model, self.dense_optimizer = parts.model, parts.dense_optimizer
        self.distributed_option = parts.distributed_option
        self._owns_process_group = False
        self._checkpointer: PeriodicCheckpointer | None = None
        self._step_hooks: list[HookHandle] = []  # this context's own hooks, while entered
        self.log_every_n_steps = positive_int(log_every_n_steps, "log_every_n_steps")
        self.tensorboard_dir = tensorboard_dir
        self._report = RankReport()  # the stats and TensorBoard curves, while entered

    # --- the step's state, as PERSIA's attributes ----------------------------------------
    @property
    def stats(self) -> RankStats | None:
        """What this rank's training did (steps, samples, loss, waits); read by /metrics and
        the TensorBoard writer. Set while the context is entered."""
        return self._report.stats

    @property
    def update_times(self) -> int:
        """Training steps taken (restored by ``--resume``)."""
        return self.training_step.steps

    @update_times.setter
    def update_times(self, value: int) -> None:
        self.training_step.steps = value

    @property
    def grad_scaler(self):
        """The loss scaler (``torch.amp.GradScaler`` with CUDA fp16), or None."""
        return self.training_step.precision.scaler

    @property
    def step_clock(self) -> StepClock:
        """Wall and CPU seconds per phase of ``backward`` (autograd, gradient_send, dense_step)."""
        return self.training_step.clock

    @property
    def _precision(self) -> Precision:
        return self.training_step.precision

    # --- lifecycle ----------------------------------------------------------------------
    def _enter(self) -> None:
        # The gradient kernel (pyrsia/shared/scatter.py), compiled while the servers are reached;
        # only a training process needs it (a data loader warming it stole ~0.45 s of CPU
        # from the NN worker's first training seconds).
        warm_in_background()
        # the step's buffers stay in the heap (pyrsia/shared/allocator.py)
        _logger.info("freed heap memory: %s", keep_freed_memory(self.settings))
        self.world_size = env.get_world_size() or 1
        self.rank_id = env.get_rank() or 0
        super()._enter()  # connects and configures the embedding hyperparameters
        try:
            self.wait_servers_ready()
            self._run(self.session.client.register_optimizer(self.embedding_optimizer.to_dict()))
            if self.world_size > 1:
                self._make_distributed()
            step = self.training_step
            step.world_size = self.world_size
            step.embedding_grad_divisor = self.embedding_grad_divisor
            step.start(
                BackwardEngine(self.session.runtime, self.session.client, limits=self.inflight)
            )
            self._start_checkpointing()
            self._start_stats()
            step.termination.install()
        except BaseException:
            self._remove_step_hooks()
            self.training_step.stop()
            self._report.close()
            super()._exit(failed=True)
            raise

    def _exit(self, failed: bool) -> None:
        step = self.training_step
        if failed and self._checkpointer is not None and not step.termination.triggered:
            self._checkpointer.report_stop()  # where --resume goes on from
        step.termination.uninstall()
        self._remove_step_hooks()
        try:
            engine = step.stop()
            if engine is not None:
                drain_s = SIGTERM_DRAIN_S if step.termination.triggered else None
                engine.flush(raise_errors=not failed, timeout_s=drain_s)
        finally:
            self._report.close()
            if self._owns_process_group and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
                self._owns_process_group = False
            super()._exit(failed)

    def _start_checkpointing(self) -> None:
        """Periodic checkpoints from global_config.yml; with ``--resume``, load the last one."""
        config = job_checkpoint.checkpointing_config(self.settings)
        self._checkpointer = PeriodicCheckpointer(config, self.rank_id, self.world_size)
        if job_checkpoint.resume_requested(self.settings):
            step = self._checkpointer.resume(self)
            if step is not None:
                self.update_times = step
        hook = self._checkpointer.hook(self)  # a step boundary: record, checkpoint if due
        self._step_hooks.append(self.training_step.add_hook("step_boundary", hook))

    def _remove_step_hooks(self) -> None:
        for handle in self._step_hooks:
            handle.remove()
        self._step_hooks = []

    def _start_stats(self) -> None:
        """The rank's stats (served by the ingress) and, when asked for, TensorBoard curves."""
        hook = self._report.start(
            self.session.stats,
            self.training_step,
            loss_every=self.log_every_n_steps,
            tensorboard_dir=self.tensorboard_dir,
            rank_id=self.rank_id,
            settings=self.session.settings,
            environment=self.settings,
        )
        self._step_hooks.append(hook)

    def log_scalar(self, tag: str, value, step: int | None = None) -> None:
        """Add one scalar to this rank's TensorBoard run (``ctx.log_scalar("eval/auc", auc)``)
        at ``step`` (default: the steps trained so far); nothing without a ``tensorboard_dir``.
        ``value`` may be a tensor: it is read as a float on the writer's thread."""
        self._report.log_scalar(tag, value, self.update_times if step is None else step)

    def wait_servers_ready(self) -> None:
        """Wait until every embedding worker (and through it every PS replica) is ready."""
        self._run(self.session.client.wait_ready())

    def _before_nested(self) -> None:
        self.wait_for_gradients()

    def wait_for_gradients(self) -> None:
        """Block until every embedding gradient sent so far is applied; raise send errors."""
        engine = self.training_step.gradients
        if engine is not None:
            engine.flush()

    # --- distribution -------------------------------------------------------------------
    def _make_distributed(self) -> None:
        option = self.distributed_option or get_default_distributed_option(self.device_id)
        master_addr = self._get_master_addr() if option.needs_master_addr() else None
        initialized = torch.distributed.is_initialized()
        self.model, optimizer = option.convert2distributed_model(
            self.model,
            self.world_size,
            self.rank_id,
            self.device_id,
            master_addr=master_addr,
            optimizer=self.dense_optimizer,
        )
        self._owns_process_group = not initialized and torch.distributed.is_initialized()
        if optimizer is not None:
            self.dense_optimizer = optimizer
        _logger.info(
            "rank %d/%d: model wrapped for data-parallel training", self.rank_id, self.world_size
        )

    def _get_master_addr(self, timeout_s: float = DEFAULT_WAIT_TIMEOUT_S) -> str:
        """Rank 0 publishes its address in the registry; the other ranks wait for it."""
        return self.session.exchange_master_addr(self.rank_id, timeout_s)

    # --- training step ------------------------------------------------------------------
    def backward(
        self, loss: torch.Tensor, embedding_gradient_check_frequency: int = 20
    ) -> torch.Tensor:
        """Backpropagate ``loss``, send the embedding gradients, step the dense optimizer.

        Returns the loss as scaled for backward (the loss itself without a scaler).
        """
        if cnt_ctx() is not self or self.training_step.gradients is None:
            raise MisuseError(
                "TrainCtx.backward() called outside the context: call it inside `with TrainCtx(...) as ctx:`"
            )
        check_loss(loss)
        frequency = positive_int(
            embedding_gradient_check_frequency, "embedding_gradient_check_frequency"
        )
        batch, embeddings = self.current_batch, self._current_embeddings
        if batch is None or not embeddings:
            raise MisuseError(
                "TrainCtx.backward(): no batch was prepared; call ctx.forward(batch) first"
            )
        self.current_batch, self._current_embeddings = None, []
        return self.training_step.run(loss, batch, embeddings, self.dense_optimizer, frequency)

    def prepare_features(self, persia_training_batch: PersiaTrainingBatch):
        """As :meth:`EmbeddingCtx.prepare_features`, then the step's ``before_forward`` hooks."""
        features = super().prepare_features(persia_training_batch)
        self.training_step.before_forward(persia_training_batch)
        return features

    @property
    def embedding_grad_divisor(self) -> float:
        """What the embedding worker divides this rank's embedding gradients by, besides the
        loss scale: the world size with ``embedding_grad_reduction="mean"``, else 1."""
        return float(self.world_size) if self.embedding_grad_reduction == "mean" else 1.0

    # --- checkpoints --------------------------------------------------------------------
    def dump_checkpoint(
        self,
        dst_dir: str,
        dense_model_filename: str = "dense.pt",
        jit_dense_model_filename: str = "jit_dense.pt",
        opt_filename: str = "opt.pt",
        blocking: bool = True,
        with_jit_model: bool = False,
    ) -> None:
        """Model, dense optimizer state and embeddings (after in-flight gradients land).

        Not collective: rank 0 alone may call it (PERSIA's example does), see
        :meth:`EmbeddingCtx.dump_checkpoint`; except under EPL ``zero.level: v1``, where
        every rank must call it (the optimizer shards are gathered on rank 0).
        """
        self.wait_for_gradients()
        super().dump_checkpoint(
            dst_dir,
            dense_filename=dense_model_filename,
            jit_dense_filename=jit_dense_model_filename,
            blocking=blocking,
            with_jit_model=with_jit_model,
        )
        if hasattr(self.dense_optimizer, "consolidate_state_dict"):  # EPL zero.level v1 (ZeRO)
            self.dense_optimizer.consolidate_state_dict(to=0)  # every rank's shard, on rank 0
        if self._writer():
            self.dump_torch_state_dict(self.dense_optimizer, dst_dir, opt_filename)

    def load_checkpoint(
        self,
        src_dir: str,
        map_location=None,
        dense_model_filename: str = "dense.pt",
        opt_filename: str = "opt.pt",
        blocking: bool = True,
    ) -> None:
        """Restore model, dense optimizer state and embeddings from ``src_dir``."""
        self.wait_for_gradients()
        super().load_checkpoint(
            src_dir,
            map_location=map_location,
            dense_filename=dense_model_filename,
            blocking=blocking,
        )
        opt_path = os.path.join(src_dir, opt_filename)
        if os.path.exists(opt_path):
            self.load_torch_state_dict(self.dense_optimizer, opt_path, map_location=map_location)
        else:
            _logger.warning("%s not found: dense optimizer state not restored", opt_path)
