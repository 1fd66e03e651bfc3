"""Export a trained model for serving, and load it back: one directory, validated on load.

An exported model (the contract ``persia-launcher serve`` and ``persia.hb`` share)::

    <export_dir>/
      signature.json          inputs, id slots, outputs, embedding schema (persia.serving.signature)
      dense.pt2 | dense.ts    the dense model, torch.export (batch dim dynamic) or TorchScript,
                              called as dense(non_id_tensors, embedding_tensors)
      embedding/              a PS checkpoint (the format /dump writes; loads into N replicas)
      embedding_config.yml    copy of the job's embedding config (slots, dims, pooling)
      global_config.yml       copy of the job's global config

The directory appears atomically: everything is written under ``.<name>.tmp-…`` beside it
and renamed at the end, so a crashed export never looks like a model. Neither dense format
holds Python code or pickles; the embedding checkpoint is ``.npy`` (``allow_pickle=False``)
plus JSON.
"""

from __future__ import annotations

import copy
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from persia.serving.dense_model import load_dense, save_dense
from persia.serving.embedding_files import checkpoint_manifests, copy_checkpoint
from persia.serving.signature import (
    DENSE_KINDS,
    Signature,
    TensorSpec,
    embedding_input_shape,
)
from pyrsia.shared.config import (
    EmbeddingSchema,
    GlobalConfig,
    default_global_config,
    load_embedding_config,
    load_global_config,
)
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.settings import Settings, current

__all__ = ["ServingModel", "export_model", "load_model"]

log = logging.getLogger(__name__)

EMBEDDING_DIR = "embedding"
EMBEDDING_CONFIG_FILE = "embedding_config.yml"
GLOBAL_CONFIG_FILE = "global_config.yml"
SIGNATURE_FILE = "signature.json"

Tensors = Sequence[torch.Tensor]


# --------------------------------------------------------------------------- export


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _spec(name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, _dtype_name(t), (None, *t.shape[1:]))


def _check_sources(model: object, checkpoint_dir: object, ctx: object) -> None:
    """A torch module to export, and exactly one source of embeddings (a checkpoint or a ctx)."""
    if not isinstance(model, torch.nn.Module):
        raise InvalidInputError("model", "a torch.nn.Module", type(model).__name__)
    if (checkpoint_dir is None) == (ctx is None):
        raise InvalidInputError(
            "embedding_checkpoint_dir", "exactly one of embedding_checkpoint_dir= or ctx=", None
        )


def _check_examples(example_inputs: object) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    ok = isinstance(example_inputs, (tuple, list)) and len(example_inputs) == 2
    if ok:
        non_id, emb = example_inputs
        ok = all(
            isinstance(part, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in part)
            for part in (non_id, emb)
        )
    if not ok:
        raise InvalidInputError(
            "example_inputs",
            "(non_id_tensors, embedding_tensors): two lists of tensors, as the model is called",
            type(example_inputs).__name__,
        )
    non_id, emb = (list(p) for p in example_inputs)  # type: ignore[misc]
    sizes = {int(t.shape[0]) for t in non_id + emb if t.dim() > 0}
    if len(sizes) != 1 or any(t.dim() == 0 for t in non_id + emb):
        raise InvalidInputError(
            "example_inputs",
            "tensors that all share one batch size (first dimension)",
            sorted(sizes),
        )
    if sizes.pop() < 2:
        raise InvalidInputError(
            "example_inputs", "a batch of at least 2 samples (torch.export fixes size-1 dims)", 1
        )
    return [t.detach().cpu() for t in non_id], [t.detach().cpu().float() for t in emb]


def _schema(
    embedding_config: str | Path | EmbeddingSchema, settings: Settings
) -> tuple[EmbeddingSchema, str]:
    """The schema and the YAML text to copy into the artifact."""
    if isinstance(embedding_config, EmbeddingSchema):
        return embedding_config, yaml.safe_dump(embedding_config.to_dict(), sort_keys=False)
    if isinstance(embedding_config, (str, Path)):
        schema = load_embedding_config(embedding_config, settings=settings)
        return schema, Path(embedding_config).read_text("utf-8")
    raise InvalidInputError(
        "embedding_config", "a path to embedding_config.yml or an EmbeddingSchema", embedding_config
    )


def _global(global_config: str | Path | GlobalConfig | None, settings: Settings) -> str:
    if global_config is None:
        global_config = default_global_config()
    if isinstance(global_config, GlobalConfig):
        return yaml.safe_dump(global_config.to_dict(), sort_keys=False)
    if isinstance(global_config, (str, Path)):
        load_global_config(global_config, settings=settings)  # validated before it is copied
        return Path(global_config).read_text("utf-8")
    raise InvalidInputError(
        "global_config", "a path to global_config.yml, a GlobalConfig or None", global_config
    )


def _slots(
    schema: EmbeddingSchema, id_slots: Sequence[str] | None, emb: list[torch.Tensor]
) -> tuple[str, ...]:
    slots = tuple(schema.slot_names if id_slots is None else id_slots)
    if isinstance(id_slots, str) or len(slots) != len(emb):
        raise InvalidInputError(
            "id_slots",
            f"one slot name per example embedding tensor ({len(emb)}), in the model's order",
            list(slots),
        )
    for i, (slot, t) in enumerate(zip(slots, emb, strict=True)):
        want = embedding_input_shape(schema, slot)  # unknown slot -> ConfigError naming it
        if tuple(t.shape[1:]) != want[1:]:
            raise InvalidInputError(
                f"example_inputs[1][{i}]",
                f"shape (batch, {', '.join(map(str, want[1:]))}) for slot {slot!r}",
                tuple(t.shape),
            )
    return slots


def _non_id_names(non_id_names: Sequence[str] | None, count: int) -> list[str]:
    """One non-empty name per non-ID input (default ``non_id_<i>``)."""
    names = [f"non_id_{i}" for i in range(count)] if non_id_names is None else list(non_id_names)
    if (
        isinstance(non_id_names, str)
        or len(names) != count
        or not all(isinstance(n, str) and n for n in names)
    ):
        raise InvalidInputError("non_id_names", f"{count} non-empty names", non_id_names)
    return names


def _staging_dir(export_dir: str | Path, overwrite: bool) -> tuple[Path, Path]:
    """The artifact's absolute path, and a fresh hidden directory beside it to write into
    (renamed to the artifact at the end, so a crashed export never looks like a model)."""
    export_dir = Path(export_dir).absolute()
    if export_dir.exists() and not overwrite:
        raise InvalidInputError(
            "export_dir", "a path that does not exist yet (or overwrite=True)", str(export_dir)
        )
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = export_dir.with_name(f".{export_dir.name}.tmp-{secrets.token_hex(4)}")
    tmp.mkdir()
    return export_dir, tmp


def _eval_copy(
    model: torch.nn.Module, non_id: list[torch.Tensor], emb: list[torch.Tensor]
) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """A CPU copy of the dense model (a DDP wrapper unwrapped) in eval mode, and its outputs
    on the example batch (which fix the outputs' dtypes and shapes in the signature)."""
    dense = copy.deepcopy(getattr(model, "module", model)).cpu().eval()
    with torch.no_grad():
        outputs = dense(non_id, emb)
    return dense, [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)


def _save_embeddings(dst: Path, ctx: Any, checkpoint_dir: str | Path | None) -> list[dict]:
    """The embedding checkpoint at ``dst``: dumped by the context's PS replicas (gradients in
    flight land first) or copied from ``checkpoint_dir``; one manifest per replica."""
    if ctx is not None:
        if hasattr(ctx, "wait_for_gradients"):
            ctx.wait_for_gradients()
        ctx.dump_embedding(str(dst))
        return checkpoint_manifests(dst)
    return copy_checkpoint(Path(checkpoint_dir), dst)


def _signature(
    kind: str,
    non_id: Iterable[tuple[str, torch.Tensor]],
    schema: EmbeddingSchema,
    slots: tuple[str, ...],
    outputs: list[torch.Tensor],
    manifests: list[dict],
) -> Signature:
    """What the artifact takes and returns: the (name, example tensor) non-ID inputs' and the
    outputs' dtypes and non-batch shapes, each slot's embedding input, the checkpoint's size."""
    return Signature(
        dense_file=DENSE_KINDS[kind],
        dense_kind=kind,
        non_id_inputs=tuple(_spec(n, t) for n, t in non_id),
        id_slots=slots,
        embedding_inputs=tuple(
            TensorSpec(s, "float32", embedding_input_shape(schema, s)) for s in slots
        ),
        outputs=tuple(_spec(f"output_{i}", t) for i, t in enumerate(outputs)),
        embedding_schema=schema,
        embedding_entries=sum(int(m.get("entries", 0)) for m in manifests),
        embedding_replica_count=len(manifests),
        created_unix_ms=int(time.time() * 1000),
        torch_version=torch.__version__,
    )


def _publish(tmp: Path, export_dir: Path, signature: Signature) -> None:
    """Rename the finished ``tmp`` to ``export_dir``, replacing an older artifact there."""
    if export_dir.exists():
        shutil.rmtree(export_dir)
    os.replace(tmp, export_dir)
    log.info(
        "exported %s model (%d embedding entries) to %s",
        signature.dense_kind,
        signature.embedding_entries,
        export_dir,
    )


def export_model(
    export_dir: str | Path,
    model: torch.nn.Module,
    *,
    example_inputs: tuple[Tensors, Tensors],
    embedding_config: str | Path | EmbeddingSchema,
    global_config: str | Path | GlobalConfig | None = None,
    embedding_checkpoint_dir: str | Path | None = None,
    ctx: Any = None,
    id_slots: Sequence[str] | None = None,
    non_id_names: Sequence[str] | None = None,
    dense_format: str = "auto",
    overwrite: bool = False,
) -> Path:
    """Write ``model`` and its embeddings as a serving artifact at ``export_dir``.

    Arguments:
        model: the dense model, called ``model(non_id_tensors, embedding_tensors)``
            (a DDP wrapper is unwrapped; the export is made from a CPU copy in eval mode).
        example_inputs: ``(non_id_tensors, embedding_tensors)`` of one batch (>= 2 samples);
            they fix the dtypes and non-batch shapes; the batch dimension stays dynamic.
        embedding_config: ``embedding_config.yml`` (path) or its parsed ``EmbeddingSchema``.
        global_config: ``global_config.yml`` (path), a ``GlobalConfig``, or None (defaults).
        embedding_checkpoint_dir: a PS checkpoint to copy (``dump_embedding``'s output), or
        ctx: an entered context (TrainCtx, EmbeddingCtx, InferCtx) whose PS replicas dump
            their embeddings straight into the artifact (gradients in flight land first).
        id_slots: slot names in the order of the model's embedding tensors (default: the
            embedding config's slot order).
        non_id_names: names of the non-ID inputs (default ``non_id_<i>``).
        dense_format: ``auto`` (torch.export, TorchScript when export fails),
            ``torch.export`` or ``torchscript``.
        overwrite: replace an existing artifact at ``export_dir``.

    Returns the artifact's path.
    """
    _check_sources(model, embedding_checkpoint_dir, ctx)
    non_id, emb = _check_examples(example_inputs)
    settings = current()  # a public entry point: PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS, read now
    schema, embedding_yaml = _schema(embedding_config, settings)
    global_yaml = _global(global_config, settings)
    slots = _slots(schema, id_slots, emb)
    names = _non_id_names(non_id_names, len(non_id))
    export_dir, tmp = _staging_dir(export_dir, overwrite)
    try:
        dense, outputs = _eval_copy(model, non_id, emb)
        kind = save_dense(dense, non_id, emb, dense_format, tmp)
        manifests = _save_embeddings(tmp / EMBEDDING_DIR, ctx, embedding_checkpoint_dir)
        (tmp / EMBEDDING_CONFIG_FILE).write_text(embedding_yaml, "utf-8")
        (tmp / GLOBAL_CONFIG_FILE).write_text(global_yaml, "utf-8")
        signature = _signature(
            kind, zip(names, non_id, strict=True), schema, slots, outputs, manifests
        )
        signature.write(tmp / SIGNATURE_FILE)
        _publish(tmp, export_dir, signature)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return export_dir


# --------------------------------------------------------------------------- load


@dataclass(frozen=True)
class ServingModel:
    """A loaded artifact: the dense model, its signature and where its embeddings are."""

    path: Path
    signature: Signature
    dense: torch.nn.Module
    embedding_dir: Path
    embedding_config_path: Path
    global_config_path: Path

    @property
    def schema(self) -> EmbeddingSchema:
        return self.signature.embedding_schema

    def predict(self, non_id: Tensors, embeddings: Tensors) -> list[torch.Tensor]:
        """Run the dense model (no grad); always a list of output tensors."""
        with torch.inference_mode():
            out = self.dense(list(non_id), list(embeddings))
        return [out] if isinstance(out, torch.Tensor) else list(out)

    def predict_numpy(
        self, non_id: Sequence[np.ndarray], embeddings: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """:meth:`predict` on numpy arrays (no copies: ``torch.from_numpy``)."""
        outs = self.predict(
            [torch.from_numpy(np.ascontiguousarray(a)) for a in non_id],
            [torch.from_numpy(np.ascontiguousarray(a)) for a in embeddings],
        )
        return [o.detach().float().cpu().numpy() for o in outs]


def load_model(export_dir: str | Path, *, map_location: str | torch.device = "cpu") -> ServingModel:
    """Load an artifact written by :func:`export_model`, checking every part it needs."""
    path = Path(export_dir)
    if not path.is_dir():
        raise InvalidInputError("export_dir", "an exported model directory", str(path))
    signature = Signature.read(path / SIGNATURE_FILE)
    for name in (signature.dense_file, EMBEDDING_CONFIG_FILE, GLOBAL_CONFIG_FILE):
        if not (path / name).is_file():
            raise InvalidInputError(str(path / name), "a file of the exported model (missing)")
    manifests = checkpoint_manifests(path / EMBEDDING_DIR)
    if len(manifests) != signature.embedding_replica_count:
        raise InvalidInputError(
            "signature.json: embedding.replica_count",
            f"{len(manifests)} (the parts in {EMBEDDING_DIR}/)",
            signature.embedding_replica_count,
        )
    # a public entry point: PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS, read now
    schema = load_embedding_config(path / EMBEDDING_CONFIG_FILE, settings=current())
    if schema != signature.embedding_schema:
        raise InvalidInputError(
            EMBEDDING_CONFIG_FILE,
            "the embedding schema recorded in signature.json",
            "a different one",
        )
    return ServingModel(
        path=path,
        signature=signature,
        dense=load_dense(path / signature.dense_file, signature.dense_kind, map_location),
        embedding_dir=path / EMBEDDING_DIR,
        embedding_config_path=path / EMBEDDING_CONFIG_FILE,
        global_config_path=path / GLOBAL_CONFIG_FILE,
    )
