"""The Adult example's NN-worker script with a probe: what tests/test_cuda_adult.py checks
from inside the job.

Run through ``persia-launcher run --nn-worker tests/cuda_adult_job.py``; ``ADULT_SCRIPT``
picks the example's script it runs unchanged: ``train`` (``train.py``, whose
``MIXED_PRECISION`` knob the test sets) or ``epl`` (``train_epl.py``: EPL's amp O1 with a
fixed loss scale, micro-batches, gradient checkpointing; more EPL keys from ``EPL_*``
variables, e.g. ``EPL_OFFLOAD_LEVEL=v0``). The dense model is the example's, with two hooks
that print, once, at the first training forward::

    cuda-probe {"param_devices": [...], "autocast": ..., "output_dtype": ..., "scaler": ...}

and after the script's own last line (``test AUC: ...``)::

    cuda-probe-end {"steps": ..., "train_samples_per_s": ..., "scale": ..., ...}

(samples/s from the first training forward to the last one).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ADULT = Path(__file__).resolve().parents[1] / "examples" / "adult_income"
sys.path.insert(0, str(ADULT))

import torch  # noqa: E402
import train  # noqa: E402
import train_epl  # noqa: E402

import persia.epl as epl  # noqa: E402
from persia.ctx import TrainCtx, cnt_ctx  # noqa: E402


def _scaler_name(ctx: TrainCtx) -> str | None:
    scaler = ctx.grad_scaler
    return None if scaler is None else type(scaler).__name__


def probed(factory, seen: dict):
    """``factory`` whose model reports its first training forward into ``seen`` (and prints it)."""

    def build() -> torch.nn.Module:
        model = factory()

        def before(module, args):
            ctx = cnt_ctx()
            if not isinstance(ctx, TrainCtx):
                return
            now = time.perf_counter()
            if "ctx" in seen:  # the clock of the training forwards, for samples/s
                seen["last_t"], seen["last_step"] = now, ctx.update_times
                return
            seen["ctx"], seen["first_t"], seen["first_step"] = ctx, now, ctx.update_times
            seen["probe"] = {
                "device_id": ctx.device_id,
                "param_devices": sorted({str(p.device) for p in module.parameters()}),
                "params_pinned": all(
                    p.is_pinned() for p in module.parameters() if p.device.type == "cpu"
                ),
                "input_devices": sorted({str(t.device) for t in [*args[0], *args[1]]}),
                "autocast": torch.is_autocast_enabled("cuda"),
                "autocast_dtype": str(torch.get_autocast_dtype("cuda")),
                "scaler": _scaler_name(ctx),
            }

        def after(module, args, output):
            probe = seen.get("probe")
            if probe is not None and "output_dtype" not in probe:
                probe["output_dtype"] = str(output.dtype)
                probe["output_device"] = str(output.device)
                print("cuda-probe " + json.dumps(probe), flush=True)

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after)
        return model

    return build


def main() -> None:
    seen: dict = {}
    script = os.environ.get("ADULT_SCRIPT", "train")
    if script == "epl":
        train_epl.show_epl_logs()
        epl.init(epl.Config(train_epl.EPL_OPTIONS))
        train.main(model_factory=probed(train_epl.epl_model, seen))
    elif script == "train":
        train.main(model_factory=probed(train.DNN, seen))
    else:
        raise SystemExit(f"ADULT_SCRIPT: expected 'train' or 'epl', got {script!r}")
    ctx = seen.get("ctx")
    if ctx is None or (ctx.rank_id or 0) != 0:
        return
    elapsed = seen.get("last_t", 0.0) - seen["first_t"]
    trained_between = seen.get("last_step", 0) - seen["first_step"]
    end = {
        "steps": ctx.update_times,
        "train_samples_per_s": round(trained_between * train.TRAIN_BATCH_SIZE / elapsed, 1)
        if elapsed > 0
        else None,
        "scaler": _scaler_name(ctx),
        "scale": None if ctx.grad_scaler is None else float(ctx.grad_scaler.get_scale()),
        "skipped_updates": ctx.stats.skipped_updates if ctx.stats is not None else None,
        "max_memory_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)
        if torch.cuda.is_available()
        else 0.0,
    }
    print("cuda-probe-end " + json.dumps(end), flush=True)


if __name__ == "__main__":
    main()
