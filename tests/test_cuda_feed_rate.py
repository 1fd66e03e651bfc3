"""The feed-rate benchmark with a real GPU dense step: ``benchmarks/feed_rate.py --dense
cuda,sleep --ps-replicas 1,2`` on the Criteo-shaped set (made here, no download) at batch
1,024, short.

The ``cuda`` configuration trains the e2e DLRM on device 0 inside the NN-worker process, fed
by the real services; ``sleep`` is the same pipeline with a 2 ms sleep standing in for the
GPU; the 2-thread PyTorch baseline runs in the same run. Each runs with one PS replica and
with two: at this batch one PS core is the ceiling, so the second replica shows how far a
GPU machine's spare cores lift it. The test checks the run ends, the DLRM ran on this GPU,
and every configuration trained at a positive rate; the figures go to the JUnit report (and
the JSON and PNG to ``PYRSIA_GPU_ARTIFACTS`` when set).

Marked ``cuda``: it runs under ``make test-gpu`` and skips where torch sees no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); run `make test-gpu` there",
    ),
]


@pytest.mark.timeout(420)
def test_feed_rate_with_the_dense_step_on_the_gpu(tmp_path, record_property):
    out = Path(os.environ.get("PYRSIA_GPU_ARTIFACTS") or tmp_path)
    json_path = out / "feed_rate.json"
    args = [
        sys.executable,
        str(REPO / "benchmarks" / "feed_rate.py"),
        "--dense",
        "cuda,sleep",
        "--datasets",
        "criteo",
        "--criteo-rows",
        "20000",
        "--batches",
        "1024",
        "--min-steps",
        "60",
        "--ps-replicas",
        "1,2",
        "--json",
        str(json_path),
        "--png",
        str(out / "feed_rate.png"),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        args,
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=400,
    )
    (tmp_path / "feed_rate.log").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    doc = json.loads(json_path.read_text())
    configs = {(c["dense"], c["ps_replicas"]): c for c in doc["results"][0]["configs"]}
    assert set(configs) == {(d, n) for d in ("cuda", "sleep") for n in (1, 2)}, list(configs)
    for n in (1, 2):
        assert configs["cuda", n]["device"] == torch.cuda.get_device_name(0), configs["cuda", n]
        assert configs["sleep", n]["device"] == "cpu"
    record_property("gpu", torch.cuda.get_device_name(0))
    for (name, n), c in configs.items():
        assert c["samples_per_s"] > 0 and c["baseline_samples_per_s"] > 0, c
        record_property(f"{name}_ps{n}_samples_per_s", round(c["samples_per_s"], 1))
        record_property(f"{name}_ps{n}_ratio", round(c["ratio"], 3))
        record_property(f"{name}_ps{n}_nn_cpu_ms_outside_dense", c["nn_cpu_ms_outside_dense"])
    record_property(
        "baseline_samples_per_s", round(configs["cuda", 1]["baseline_samples_per_s"], 1)
    )
    print("\n" + proc.stdout[-3000:])
