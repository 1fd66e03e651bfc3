"""`python -m persia.hb.run` and `persia-launcher nn-worker`: one rank per visible GPU.

The ranks are real processes started by torch.distributed.run; each records the
RANK / LOCAL_RANK / WORLD_SIZE it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyrsia.services.nn_worker.devices import count_visible, visible_gpu_count
from pyrsia.shared.errors import ConfigError
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
RECORD = """
import json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
"""


def _env(**overrides: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        env.pop(key, None)
    env.update({k: v for k, v in overrides.items() if v is not None})
    return env


def _ranks(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _hb_run(tmp_path: Path, flags: list[str], env: dict[str, str]) -> list[dict]:
    script = tmp_path / "record.py"
    script.write_text(RECORD)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.hb.run",
            "--master-port",
            str(free_port()),
            *flags,
            sys.executable,
            str(script),
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _ranks(tmp_path)


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("0,1", 2),
        ("3", 1),
        ("", 0),
        ("none", 0),
        ("void", 0),
        ("GPU-6f2d1a,GPU-77aa", 2),
        ("MIG-1", 1),
        ("0,-1,2", 1),
        (" 0 , 1 ", 2),
    ],
)
def test_visible_device_values_are_counted_like_cuda(value, count):
    assert count_visible(value, "CUDA_VISIBLE_DEVICES") == count


def test_cuda_variable_wins_and_bad_values_name_the_variable():
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "0,1,2"}) == 1
    assert visible_gpu_count({"NVIDIA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert visible_gpu_count({}) == 0  # this machine has no GPU
    assert visible_gpu_count({"NVIDIA_VISIBLE_DEVICES": "all"}) == 0
    with pytest.raises(ConfigError, match="NVIDIA_VISIBLE_DEVICES: expected a comma list"):
        visible_gpu_count({"NVIDIA_VISIBLE_DEVICES": "gpu0,gpu1"})


def test_hb_run_starts_one_rank_on_a_cpu_only_machine(tmp_path):
    ranks = _hb_run(tmp_path, [], _env())
    assert [(r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "0", "1")]
    assert ranks[0]["MASTER_ADDR"] and ranks[0]["MASTER_PORT"]


def test_hb_run_starts_one_rank_per_visible_gpu(tmp_path):
    ranks = _hb_run(tmp_path, [], _env(NVIDIA_VISIBLE_DEVICES="0,1"))
    assert sorted((r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"]) for r in ranks) == [
        ("0", "0", "2"),
        ("1", "1", "2"),
    ]


def test_nproc_per_node_wins_over_the_visible_gpus(tmp_path):
    ranks = _hb_run(tmp_path, ["--nproc-per-node", "1"], _env(CUDA_VISIBLE_DEVICES="0,1,2"))
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "1")]


def test_nn_worker_launcher_counts_visible_gpus_without_nproc_per_node(tmp_path):
    script = tmp_path / "record.py"
    script.write_text(RECORD)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.launcher",
            "nn-worker",
            str(script),
            "--master-port",
            str(free_port()),
            "--",
            str(tmp_path),
        ],
        cwd=REPO,
        env=_env(CUDA_VISIBLE_DEVICES="0,1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(r["RANK"] for r in _ranks(tmp_path)) == ["0", "1"]


def test_hb_run_refuses_bad_input_with_exit_code_2(tmp_path):
    bad_gpus = subprocess.run(
        [sys.executable, "-m", "persia.hb.run", "python", "x.py"],
        cwd=REPO,
        env=_env(CUDA_VISIBLE_DEVICES="first"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad_gpus.returncode == 2 and "CUDA_VISIBLE_DEVICES" in bad_gpus.stderr
    no_command = subprocess.run(
        [sys.executable, "-m", "persia.hb.run", "--nproc-per-node", "1", "no-such-program-here"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        no_command.returncode == 2
        and "no-such-program-here: command not found" in no_command.stderr
    )


def test_hb_run_returns_the_failing_rank_exit_code(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.hb.run",
            "--nproc-per-node",
            "1",
            "--master-port",
            str(free_port()),
            sys.executable,
            "-c",
            "raise SystemExit(7)",
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 7, proc.stderr[-2000:]
