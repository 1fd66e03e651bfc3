"""Periodic point-in-time checkpoints inside ``TrainCtx``, and resuming from the last one.

Switched on in ``global_config.yml`` (``common_config.checkpointing_config``)::

    checkpoint_dir: /data/ckpt          # seen by every NN worker and PS replica
    checkpoint_every_n_steps: 50        # and/or checkpoint_every_n_seconds: 600
    keep_checkpoints: 2

At every step boundary (a :class:`~pyrsia.services.nn_worker.step.TrainingStep` hook that
``TrainCtx`` adds when entered, :meth:`PeriodicCheckpointer.hook`) records the
trained batch and asks :meth:`PeriodicCheckpointer.after_step` whether one is due (ranks agree: the step count is the same on every rank, and a time
trigger is all-reduced). Writing one (see :mod:`pyrsia.shared.job_checkpoint` for the
layout): every rank drains its in-flight embedding gradients and records which batches it
has trained; barrier; rank 0 dumps every PS shard (through the embedding workers), the
dense model and optimizer, and commits the manifest; barrier. No rank applies a gradient
in between, so the shards are consistent with each other and with the dense model.

``persia-launcher nn-worker --resume`` makes ``TrainCtx.__enter__`` load the newest
complete checkpoint (embeddings on rank 0, dense state on every rank) and continue the
step count; ``persia-launcher data-loader --resume`` makes ``DataCtx`` skip the batches
that checkpoint lists, so the epoch completes with every batch trained exactly once.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from pyrsia.services.nn_worker.session import Session
from pyrsia.services.nn_worker.step import StepEvent
from pyrsia.shared import job_checkpoint as jc
from pyrsia.shared.config import CheckpointingConfig


class CheckpointHost(Protocol):
    """What a checkpoint reads and restores: ``persia.ctx.TrainCtx`` is one."""

    model: torch.nn.Module
    dense_optimizer: torch.optim.Optimizer
    update_times: int

    @property
    def session(self) -> Session: ...

    def wait_for_gradients(self) -> None: ...

    def dump_torch_state_dict(self, torch_instance: Any, dst_dir: str, file_name: str) -> None: ...

    def load_torch_state_dict(self, torch_instance: Any, src_dir: str) -> None: ...


def barrier() -> None:
    """Every rank waits here (a no-op without a process group)."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


log = logging.getLogger(__name__)


class PeriodicCheckpointer:
    """Counts trained batches and writes/loads job checkpoints for one ``TrainCtx``."""

    def __init__(
        self, config: CheckpointingConfig, rank: int, world_size: int, *, clock=time.monotonic
    ):
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.root = Path(config.checkpoint_dir).resolve() if config.checkpoint_dir else None
        self.trained: list[int] = []  # batch ids this rank trained (incl. restored ones)
        self.resumed_from: Path | None = None
        self.base_updates_applied = 0  # acknowledged updates already in the resumed checkpoint
        self.written = 0
        self._clock = clock
        self._last_time = clock()

    def record(self, batch_id: int | None) -> None:
        """One trained batch (its embedding gradients were handed to the backward engine).

        Only batches from data loaders have a position to resume from (ids >= 0); a batch
        looked up directly (IterableDataset) gets a negative id from its embedding worker.
        """
        if batch_id is not None and batch_id >= 0:
            self.trained.append(int(batch_id))

    def hook(self, ctx: CheckpointHost):
        """The ``step_boundary`` hook of ``ctx``'s training step: record, then checkpoint if due."""

        def on_step_boundary(event: StepEvent) -> None:
            if not event.shadow:  # a shadow step trains no batch
                self.record(event.batch.batch_id)
            self.after_step(ctx)

        return on_step_boundary

    # --- writing ------------------------------------------------------------------------
    def after_step(self, ctx: CheckpointHost) -> None:
        """At a step boundary: write a checkpoint when one is due."""
        if not self.config.periodic:
            return
        step = ctx.update_times
        every_n = self.config.checkpoint_every_n_steps
        due = every_n > 0 and step % every_n == 0
        every_s = self.config.checkpoint_every_n_seconds
        if every_s > 0 and not due:
            due = self._agree(self._clock() - self._last_time >= every_s)
        if due:
            self.save(ctx, step)
            self._last_time = self._clock()

    def _agree(self, flag: bool) -> bool:
        if self.world_size <= 1 or not torch.distributed.is_initialized():
            return flag
        tensor = torch.tensor([1 if flag else 0])
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return bool(tensor.item())

    def save(self, ctx: CheckpointHost, step: int) -> Path:
        """Write the checkpoint of ``step`` (every rank calls this at the same step)."""
        assert self.root is not None
        started = time.monotonic()
        directory = jc.step_dir(self.root, step)
        ctx.wait_for_gradients()  # the staleness window is drained: every update acknowledged
        jc.save_data_position(directory, self.rank, self.trained)
        barrier()  # every rank drained and recorded; nobody sends a gradient until the end
        if hasattr(ctx.dense_optimizer, "consolidate_state_dict"):  # EPL ZeRO: a collective
            ctx.dense_optimizer.consolidate_state_dict(to=0)  # every rank's shard, on rank 0
        if self.rank == 0:
            ctx.dump_torch_state_dict(ctx.model, str(directory), jc.DENSE_FILE)
            ctx.dump_torch_state_dict(ctx.dense_optimizer, str(directory), jc.OPTIMIZER_FILE)
            embedding_dir = directory / jc.EMBEDDING_SUBDIR
            embedding_dir.mkdir(parents=True, exist_ok=True)
            ctx.session.runtime.run(ctx.session.client.dump(str(embedding_dir)))
            stats = ctx.session.runtime.run(ctx.session.client.stats()).ps
            jc.commit(
                directory,
                {
                    "step": step,
                    "world_size": self.world_size,
                    "trained_batches": int(jc.trained_batch_ids(directory).shape[0]),
                    "ps_replicas": len(stats),
                    "ps_entries": [s.entries for s in stats],
                    "ps_updates_applied": [s.updates_applied for s in stats],
                    # every acknowledged embedding update this state holds, across resumes
                    "updates_applied_total": self.base_updates_applied
                    + sum(s.updates_applied for s in stats),
                    "resumed_from": str(self.resumed_from) if self.resumed_from else None,
                },
            )
            jc.prune(self.root, self.config.keep_checkpoints)
        barrier()
        self.written += 1
        log.info(
            "checkpoint of step %d written to %s in %.2fs",
            step,
            directory,
            time.monotonic() - started,
        )
        return directory

    def report_stop(self) -> None:
        """After the training loop failed: log which checkpoint the job resumes from.

        Whatever stopped it (a lost PS, worker or peer), the newest complete checkpoint is
        where ``--resume`` goes on; the updates acknowledged after it are rolled back then.
        """
        if self.root is None or not self.config.periodic:
            return
        directory = jc.latest_complete(self.root)
        if directory is None:
            log.error(
                "training stopped before the first complete checkpoint in %s: start the job "
                "again from the beginning",
                self.root,
            )
            return
        manifest = jc.read_manifest(directory) or {}
        log.error(
            "training stopped; the newest complete checkpoint is %s (step %s): start the NN "
            "worker and the data loaders again with --resume (docker compose: PERSIA_RESUME=1) "
            "to go on from it",
            directory,
            manifest.get("step", "?"),
        )

    # --- resuming -----------------------------------------------------------------------
    def resume(self, ctx: CheckpointHost) -> int | None:
        """Load the newest complete checkpoint into ``ctx``; its step, or None if there is none."""
        if self.root is None:
            log.warning(
                "--resume given but common_config.checkpointing_config.checkpoint_dir is not set: "
                "starting from scratch"
            )
            return None
        directory = jc.latest_complete(self.root)
        if directory is None:
            log.warning("--resume: no complete checkpoint in %s: starting from scratch", self.root)
            return None
        manifest = jc.read_manifest(directory)
        assert manifest is not None
        started = time.monotonic()
        ctx.load_torch_state_dict(ctx.model, str(directory / jc.DENSE_FILE))
        ctx.load_torch_state_dict(ctx.dense_optimizer, str(directory / jc.OPTIMIZER_FILE))
        if self.rank == 0:
            ctx.session.runtime.run(
                ctx.session.client.load(os.fspath(directory / jc.EMBEDDING_SUBDIR))
            )
        barrier()
        trained = jc.trained_batch_ids(directory)
        self.trained = [int(i) for i in trained]  # every rank: its ingress steps over them
        ctx.session.resume_skip = frozenset(self.trained)
        self.resumed_from = directory
        self.base_updates_applied = int(manifest.get("updates_applied_total", 0))
        step = int(manifest["step"])
        # WARNING, not INFO: a rollback is worth seeing even where nobody configured logging
        log.warning(
            "resumed from %s: step %d, %d batches already trained, in %.2fs",
            directory,
            step,
            int(manifest.get("trained_batches", 0)),
            time.monotonic() - started,
        )
        return step
