"""The dense model file of a serving artifact: written with torch.export (``dense.pt2``,
the batch dimension dynamic) or TorchScript (``dense.ts``), and loaded back.

``save_dense`` tries torch.export first in ``auto`` mode and falls back to TorchScript;
``load_dense`` reads either. Neither format holds Python code or pickles.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from persia.serving.signature import DENSE_KINDS
from pyrsia.shared.constants import SERVE_MAX_BATCH as MAX_BATCH
from pyrsia.shared.errors import InvalidInputError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def torchscript_quietly() -> Iterator[None]:
    """TorchScript is deprecated in torch 2.13; it stays as the fallback format on purpose
    (torch.export is tried first), so its DeprecationWarning is not repeated to the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        yield


def save_dense(model: torch.nn.Module, non_id: list, emb: list, kind: str, dst: Path) -> str:
    """Write ``dense.pt2`` (torch.export) or ``dense.ts``; ``auto`` falls back to TorchScript."""
    if kind in ("auto", "torch.export"):
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        dynamic = ([{0: batch} for _ in non_id], [{0: batch} for _ in emb])
        try:
            program = torch.export.export(model, (non_id, emb), dynamic_shapes=dynamic)
            torch.export.save(program, str(dst / DENSE_KINDS["torch.export"]))
            return "torch.export"
        except Exception as exc:  # torch raises many kinds; auto mode tries TorchScript next
            if kind != "auto":
                raise
            log.warning("torch.export failed (%s); exporting TorchScript instead", exc)
    if kind not in ("auto", "torchscript"):
        raise InvalidInputError("dense_format", "'auto', 'torch.export' or 'torchscript'", kind)
    with torchscript_quietly():
        torch.jit.save(torch.jit.script(model), str(dst / DENSE_KINDS["torchscript"]))
    return "torchscript"


def load_dense(file: Path, kind: str, map_location: str | torch.device) -> torch.nn.Module:
    """The dense model in ``file``, written as ``kind`` (``torch.export`` or ``torchscript``),
    on ``map_location``; a TorchScript module is put in eval mode."""
    if kind == "torch.export":
        dense = torch.export.load(str(file)).module()
        return dense if str(map_location) == "cpu" else dense.to(map_location)
    with torchscript_quietly():
        dense = torch.jit.load(str(file), map_location=map_location)
    dense.eval()
    return dense
