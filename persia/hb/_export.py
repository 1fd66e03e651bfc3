"""``hb.train.export``: a model with sharded torch embeddings as a Pyrsia serving artifact.

The artifact (:mod:`persia.serving.artifact`) wants a dense model called as
``dense(non_id_tensors, embedding_tensors)``, while an hb model is called with its
own arguments, some of them ids that its sharded modules look up. The export finds
out which argument feeds which module by calling the model once on
``example_inputs`` (eval mode, no gradient), then writes a *dense view*: a copy of the
model whose sharded modules are replaced by pass-throughs and whose id arguments
receive the pooled embeddings instead::

    model(dense, cat_ids, education)            self.cats(cat_ids) -> (B, dim) from the PS
    dense_view([dense], [e_cats, e_education])  = the copy called as (dense, e_cats, e_education)
                                                  with self.cats(x) -> x

So an id argument must go straight into one sharded module, called once, and used
nowhere else; the module must produce what the serving embedding worker returns for
the slot's summed bag: ``EmbeddingBag(mode="sum")`` or an ``Embedding`` of a 1-D id
tensor (one id per sample), without ``padding_idx``. Anything else is refused with the
reason. The embeddings come from ``checkpoint`` (a PS checkpoint directory) or, when
it is None, from a dump of the live PS replicas taken after every in-flight gradient
has landed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from persia.hb._ps import connection
from persia.hb.embedding import ShardedEmbedding, ShardedEmbeddingBag
from persia.serving.artifact import export_model
from pyrsia.shared.errors import InvalidInputError

_SHARDED = (ShardedEmbedding, ShardedEmbeddingBag)


class _PassThrough(nn.Module):
    """Stands for a sharded module in the dense view: its input already is the embedding."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x


class DenseView(nn.Module):
    """``model`` called as ``(non_id_tensors, embedding_tensors)`` (see the module docstring)."""

    def __init__(self, model: nn.Module, id_positions: Sequence[int], arity: int):
        super().__init__()
        self.inner = copy.deepcopy(model)
        for name, module in list(self.inner.named_modules()):
            if isinstance(module, _SHARDED):
                parent_name, _, child = name.rpartition(".")
                parent = self.inner.get_submodule(parent_name) if parent_name else self.inner
                setattr(parent, child, _PassThrough())
        self.id_positions = tuple(id_positions)
        self.non_id_positions = tuple(i for i in range(arity) if i not in self.id_positions)

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]):
        args: list[torch.Tensor | None] = [None] * (
            len(self.id_positions) + len(self.non_id_positions)
        )
        for position, tensor in zip(self.non_id_positions, non_id, strict=True):
            args[position] = tensor
        for position, tensor in zip(self.id_positions, embeddings, strict=True):
            args[position] = tensor
        return self.inner(*args)


class _LivePS:
    """The ``ctx`` export_model dumps through: the hb connection's PS replicas."""

    def wait_for_gradients(self) -> None:
        connection.flush()

    def dump_embedding(self, directory: str) -> None:
        connection.dump(directory)


def _trace_ids(
    model: nn.Module, example_inputs: tuple
) -> tuple[list[int], list[str], list[torch.Tensor]]:
    """Which argument feeds which sharded module: (positions, slots, pooled example rows)."""
    calls: list[tuple[nn.Module, tuple, torch.Tensor]] = []
    handles = [
        m.register_forward_hook(lambda mod, inputs, output: calls.append((mod, inputs, output)))
        for m in model.modules()
        if isinstance(m, _SHARDED)
    ]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(*example_inputs)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    if not calls:
        raise InvalidInputError(
            "model", "a model with hb.scope(sharding=True) embeddings", "none called"
        )
    positions, slots, rows, seen = [], [], [], set()
    for module, inputs, output in calls:
        where = [i for i, arg in enumerate(example_inputs) if arg is inputs[0]]
        label = f"{type(module).__name__}(slot={module.slot!r})"
        if not where:
            raise InvalidInputError(
                label, "to be called with one of the model's arguments as is", "a computed tensor"
            )
        if where[0] in positions or id(module) in seen:
            raise InvalidInputError(
                label, "one call per export (each id argument feeds one module)", "several"
            )
        if isinstance(module, ShardedEmbeddingBag) and (module.mode != "sum" or len(inputs) > 1):
            raise InvalidInputError(
                label, "mode='sum' with 2-D ids (what the serving worker pools)", module.mode
            )
        if isinstance(module, ShardedEmbedding) and inputs[0].dim() != 1:
            raise InvalidInputError(
                label, "1-D ids (one id per sample) to be served", tuple(inputs[0].shape)
            )
        if module.padding_idx is not None:
            raise InvalidInputError(
                label, "no padding_idx (the serving path does not drop ids)", module.padding_idx
            )
        seen.add(id(module))
        positions.append(where[0])
        slots.append(str(module.slot))
        rows.append(output.detach())
    return positions, slots, rows


def export_artifact(
    export_dir: str | Path,
    checkpoint: str | Path | None = None,
    *,
    model: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    global_config: Any = None,
    non_id_names: Sequence[str] | None = None,
    dense_format: str = "auto",
    overwrite: bool = False,
) -> Path:
    """Write ``model`` (sharded embeddings + dense part) as a serving artifact at ``export_dir``.

    Arguments:
        checkpoint: a PS checkpoint directory to package; None dumps the live PS.
        model: the trained hb model (a DDP wrapper is unwrapped).
        example_inputs: one batch of the model's arguments (>= 2 samples), as it is called.
        global_config: ``global_config.yml`` path or GlobalConfig copied into the artifact.
        non_id_names: names of the non-id arguments, in order (default ``non_id_<i>``).
        dense_format / overwrite: as for :func:`persia.serving.artifact.export_model`.

    Call it on one rank (``hb.context.is_chief``). Returns the artifact's path.
    """
    inner = getattr(model, "module", model)
    if not isinstance(inner, nn.Module):
        raise InvalidInputError("model", "a torch.nn.Module", type(model).__name__)
    if not isinstance(example_inputs, (tuple, list)) or not all(
        isinstance(t, torch.Tensor) for t in example_inputs
    ):
        raise InvalidInputError(
            "example_inputs",
            "a tuple of tensors: the model's arguments",
            type(example_inputs).__name__,
        )
    example_inputs = tuple(example_inputs)
    positions, slots, rows = _trace_ids(inner, example_inputs)
    non_id = [t for i, t in enumerate(example_inputs) if i not in positions]
    order = sorted(range(len(positions)), key=positions.__getitem__)
    view = DenseView(inner, [positions[i] for i in order], len(example_inputs))
    return export_model(
        export_dir,
        view,
        example_inputs=(non_id, [rows[i] for i in order]),
        embedding_config=connection.schema(),
        global_config=global_config,
        embedding_checkpoint_dir=checkpoint,
        ctx=None if checkpoint is not None else _LivePS(),
        id_slots=[slots[i] for i in order],
        non_id_names=non_id_names,
        dense_format=dense_format,
        overwrite=overwrite,
    )
