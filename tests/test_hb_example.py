"""examples/hb_adult: two ranks through `python -m persia.hb.run`, tables on a real PS, export."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nn_helpers import job_services
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "hb_adult"


@pytest.mark.slow
def test_hb_adult_example_trains_on_two_ranks_and_exports(job_env, tmp_path):
    config = (EXAMPLE / "embedding_config.yml").read_text()
    export_dir = tmp_path / "artifact"
    env = {
        **os.environ,
        **job_env,
        "PYTHONPATH": str(REPO),
        "HB_GRAD_NBUCKETS": "2",
        "EXPORT_DIR": str(export_dir),
        "EVAL_EVERY": "60",
    }
    with job_services(job_env, tmp_path / "svc", embedding_config=config):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "persia.hb.run",
                "--nproc-per-node",
                "2",
                "--master-port",
                str(free_port()),
                sys.executable,
                str(EXAMPLE / "train.py"),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    auc = float(re.findall(r"test AUC: ([0-9.]+)", proc.stdout)[-1])
    print(f"\nhb_adult example, 2 ranks, 1 epoch: test AUC {auc:.4f}")
    assert auc > 0.85
    assert "rank 0 of 2" in proc.stdout
    signature = json.loads((export_dir / "signature.json").read_text())
    assert signature["id_slots"] == ["cats", "education"]
