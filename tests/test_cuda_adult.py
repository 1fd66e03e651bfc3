"""The Adult job on CUDA device 0, as a user runs it: ``persia-launcher run`` on the example's
scripts (through tests/cuda_adult_job.py, which adds a probe and nothing else).

- ``train.py`` with ``MIXED_PRECISION=1``: fp16 autocast and torch's dynamic ``GradScaler``;
  the dense parameters and the batch tensors live on ``cuda:0``; the loss falls and the
  test AUC clears the same floor as the CPU job's.
- ``train_epl.py`` with ``EPL_OFFLOAD_LEVEL=v0``: EPL's amp O1 (fp16, fixed loss scale 128)
  with the dense weights offloaded to pinned CPU memory, micro-batches and gradient
  checkpointing, trained on the GPU to the same floor.

Marked ``cuda``: they run under ``make test-gpu`` and skip where torch sees no GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
ADULT = REPO / "examples" / "adult_income"
JOB = REPO / "tests" / "cuda_adult_job.py"
AUC_FLOOR = 0.85  # what the CPU job's tests ask (tests/test_e2e_adult.py)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); run `make test-gpu` there",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def adult_data():
    subprocess.run(
        [sys.executable, str(ADULT / "data_prep.py")], check=True, cwd=REPO, capture_output=True
    )


def run_adult(tmp_path: Path, name: str, **env: str) -> tuple[str, dict, dict]:
    """Run the Adult job through ``persia-launcher run`` with the probe; return its output,
    the probe's first-forward record and its end record. With ``PYRSIA_GPU_ARTIFACTS`` set
    (scripts/gpu_check.sh), the job's log is also saved there as ``<name>.log``."""
    environ = {
        k: v for k, v in os.environ.items() if k not in ("PERSIA_REDIS_URL", "PERSIA_JOB_ID")
    }
    environ.update(CUDA_VISIBLE_DEVICES=environ.get("CUDA_VISIBLE_DEVICES", "0"), **env)
    args = [
        sys.executable,
        "-m",
        "persia.launcher",
        "run",
        "--no-progress",
        "--nn-worker",
        str(JOB),
        "--data-loader",
        str(ADULT / "data_loader.py"),
        "--embedding-config",
        str(ADULT / "config" / "embedding_config.yml"),
        "--global-config",
        str(ADULT / "config" / "global_config.yml"),
    ]
    proc = subprocess.run(
        args,
        cwd=tmp_path,
        env=environ,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    out = proc.stdout
    (tmp_path / "run.log").write_text(out)
    artifacts = os.environ.get("PYRSIA_GPU_ARTIFACTS")
    if artifacts:
        Path(artifacts, f"{name}.log").write_text(out)
    assert proc.returncode == 0, out[-4000:]
    probe = re.search(r"cuda-probe (\{.*\})", out)
    end = re.search(r"cuda-probe-end (\{.*\})", out)
    assert probe and end, out[-4000:]
    return out, json.loads(probe[1]), json.loads(end[1])


def trained(out: str) -> tuple[int, float, float, float]:
    """``(steps, mean loss of the first steps, of the last steps, test AUC)`` from the log."""
    line = re.search(
        r"trained (\d+) steps; mean loss of the first \d+ steps ([\d.]+), of the last \d+ ([\d.]+)",
        out,
    )
    auc = re.search(r"test AUC: ([\d.]+)", out)
    assert line and auc, out[-4000:]
    return int(line[1]), float(line[2]), float(line[3]), float(auc[1])


def _record(record_property, **figures) -> None:
    """The job's figures as JUnit properties (``--junitxml``), with the GPU's name."""
    record_property("gpu", torch.cuda.get_device_name(0))
    for key, value in figures.items():
        record_property(key, value)


@pytest.mark.timeout(330)
def test_adult_trains_on_cuda_with_fp16_autocast_and_dynamic_grad_scaler(tmp_path, record_property):
    out, probe, end = run_adult(tmp_path, "adult_fp16", MIXED_PRECISION="1")
    assert probe["device_id"] == 0
    assert probe["param_devices"] == ["cuda:0"], probe
    assert probe["input_devices"] == ["cuda:0"], probe  # dense features and embeddings
    assert probe["autocast"] is True and probe["autocast_dtype"] == "torch.float16", probe
    assert probe["output_dtype"] == "torch.float16" and probe["output_device"] == "cuda:0", probe
    assert probe["scaler"] == "GradScaler" and end["scaler"] == "GradScaler", (probe, end)
    assert end["scale"] is not None and end["scale"] >= 1.0, end
    steps, first, last, auc = trained(out)
    assert steps == end["steps"] == 255, (steps, end)  # one epoch of 128-sample batches
    assert last < first * 0.8, (first, last)
    assert auc > AUC_FLOOR, auc
    _record(record_property, auc=auc, first_loss=first, last_loss=last, **end)
    print(
        f"\nadult fp16+GradScaler on {torch.cuda.get_device_name(0)}: AUC {auc:.4f}, "
        f"loss {first:.4f} -> {last:.4f}, final loss scale {end['scale']:g}, "
        f"skipped updates {end['skipped_updates']}, peak GPU memory {end['max_memory_mb']} MB"
    )


@pytest.mark.timeout(330)
def test_adult_epl_amp_with_offloaded_weights_trains_on_cuda(tmp_path, record_property):
    out, probe, end = run_adult(
        tmp_path, "adult_epl_offload", ADULT_SCRIPT="epl", EPL_OFFLOAD_LEVEL="v0"
    )
    assert probe["device_id"] == 0
    # offload v0: the weights live in pinned CPU memory, each use computes on the GPU
    assert probe["param_devices"] == ["cpu"] and probe["params_pinned"] is True, probe
    assert probe["input_devices"] == ["cuda:0"], probe
    assert probe["autocast"] is True and probe["autocast_dtype"] == "torch.float16", probe
    assert probe["output_dtype"] == "torch.float16" and probe["output_device"] == "cuda:0", probe
    assert probe["scaler"] == "FixedLossScaler" and end["scale"] == 128.0, (probe, end)
    steps, first, last, auc = trained(out)
    assert steps == 255, steps
    assert last < first * 0.8, (first, last)
    assert auc > AUC_FLOOR, auc
    _record(record_property, auc=auc, first_loss=first, last_loss=last, **end)
    print(
        f"\nadult EPL amp O1 + offload v0 on {torch.cuda.get_device_name(0)}: AUC {auc:.4f}, "
        f"loss {first:.4f} -> {last:.4f}, skipped updates {end['skipped_updates']}"
    )
