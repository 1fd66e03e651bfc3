"""``benchmarks/rank_quality.py``: its lockstep control and its command line.

The benchmark's conclusions rest on its lockstep emulation of data-parallel ranks
(``run_sync``): with one rank it must train exactly as the single-process baseline does, and
with two it must differ from one process at the doubled batch (each rank's embedding
gradient applied by itself, PERSIA's "sum"). A bad flag exits 2 naming it. The full AUC
comparison is the slow test of ``tests/test_rank_window.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import rank_quality  # noqa: E402
from e2e import data as e2e_data  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """8 batches of 1,024 rows of the Criteo-shaped set and 2,048 test rows."""
    path = tmp_path_factory.mktemp("rq") / "criteo.npz"
    e2e_data.prepare("criteo", path, criteo_rows=8192, seed=0, max_test_rows=2048)
    return e2e_data.load(path)


@pytest.mark.timeout(120)
def test_one_lockstep_rank_trains_as_the_single_process_baseline(tiny):
    base = rank_quality.run_baseline(tiny, 0, rows=1024, lr_scale=1)
    one = rank_quality.run_sync(tiny, 0, ranks=1, rows=1024, lr_scale=1, reduction="sum")
    assert one["steps"] == base["steps"] == 8
    assert one["auc"] == pytest.approx(base["auc"], abs=1e-4)


@pytest.mark.timeout(120)
def test_two_lockstep_ranks_are_not_one_process_at_the_doubled_batch(tiny):
    two = rank_quality.run_sync(tiny, 0, ranks=2, rows=1024, lr_scale=2, reduction="sum")
    mean = rank_quality.run_sync(tiny, 0, ranks=2, rows=1024, lr_scale=2, reduction="mean")
    big = rank_quality.run_baseline(tiny, 0, rows=2048, lr_scale=2)
    # "mean" applies half of each rank's gradient: nearly one process at 2,048 rows (one
    # Adagrad step of the mean instead of two of the halves); "sum" moves embeddings further
    assert abs(two["auc"] - big["auc"]) > abs(mean["auc"] - big["auc"])


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--configs", "pyrsia_3ranks"], "--configs"),
        (["--seeds", "1,1"], "--seeds"),
        (["--datasets", "mnist"], "--datasets"),
        (["--criteo-rows", "0"], "--criteo-rows"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(flags, named):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "rank_quality.py"), *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert named in proc.stderr
