"""The defaults a user gets without asking are the fast, accurate path (issue 46).

- ``persia-launcher nn-worker`` gives each rank this machine's cores shared by the node's
  ranks as torch threads when ``OMP_NUM_THREADS`` is unset (torch's own default for one
  rank), and keeps an ``OMP_NUM_THREADS`` the user set.
- A training ``DataLoader`` given no ``embedding_staleness`` applies the automatic bound
  (``AUTO_EMBEDDING_STALENESS``) and the measured window under it; an explicit bound is kept
  as PERSIA documents it; evaluation is not bounded.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import Adagrad
from pyrsia.services.embedded.job import reset_embedded_job
from pyrsia.services.nn_worker.launch import rank_threads
from pyrsia.shared.constants import (
    AUTO_EMBEDDING_STALENESS,
    ENV_DATALOADER_ENTRY,
    ENV_EMBEDDED,
    ENV_EMBEDDING_CONFIG,
    ENV_GLOBAL_CONFIG,
)
from tests.nn_helpers import EMBEDDING_CONFIG, SmallModel, make_batch
from tests.rank_launch import nn_worker_argv
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parent.parent
CORES = len(os.sched_getaffinity(0))

THREADS_PY = """\
import os, torch
print("THREADS", os.environ["OMP_NUM_THREADS"], torch.get_num_threads(), flush=True)
"""


# --- torch threads per rank ----------------------------------------------------------------
def test_rank_threads_share_the_cores_among_the_nodes_ranks():
    assert rank_threads(1) == rank_threads("1") == CORES
    assert rank_threads(2) == max(1, CORES // 2)
    assert rank_threads(4 * CORES) == 1  # never below one thread
    assert rank_threads("auto") == rank_threads("gpu") == 1  # not a count: torchrun's 1


def _launch(tmp_path: Path, **env: str) -> str:
    script = tmp_path / "threads.py"
    script.write_text(THREADS_PY)
    drop = ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE")
    run_env = {k: v for k, v in os.environ.items() if k not in drop} | env
    # no Redis listens there: the launcher goes on without a job lease, as it says
    run_env.update(
        PERSIA_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        PERSIA_JOB_ID=f"threads-{uuid.uuid4().hex[:8]}",
    )
    proc = subprocess.run(
        nn_worker_argv(script, 1),
        cwd=tmp_path,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if "THREADS" in ln)
    return line[line.index("THREADS") :]


@pytest.mark.timeout(150)
def test_a_one_rank_nn_worker_gets_every_core_unless_omp_num_threads_is_set(tmp_path):
    assert _launch(tmp_path) == f"THREADS {CORES} {CORES}"  # torch's own default
    assert _launch(tmp_path, OMP_NUM_THREADS="1") == "THREADS 1 1"  # the user's setting kept


# --- the staleness bound -----------------------------------------------------------------
class Batches(IterableDataset):
    def __iter__(self):
        for k in range(4):
            yield make_batch([100 + k, 101 + k], seed=k)


def test_the_staleness_bound_is_automatic_unless_given():
    assert AUTO_EMBEDDING_STALENESS == 8
    assert DataLoader(Batches()).embedding_staleness is None  # PERSIA's default argument
    assert DataLoader(Batches()).staleness_bound == AUTO_EMBEDDING_STALENESS
    assert DataLoader(Batches(), embedding_staleness=3).staleness_bound == 3


@pytest.fixture
def embedded_job(tmp_path, monkeypatch):
    """PERSIA_EMBEDDED=1 (engines in this process, no servers to start) with the helpers'
    embedding config; a fresh engine before and after."""
    emb = tmp_path / "embedding_config.yml"
    emb.write_text(EMBEDDING_CONFIG)
    glob = tmp_path / "global_config.yml"
    glob.write_text("embedding_parameter_server_config: {capacity: 100000}\n")
    for key, value in {
        ENV_EMBEDDED: "1",
        ENV_EMBEDDING_CONFIG: str(emb),
        ENV_GLOBAL_CONFIG: str(glob),
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(ENV_DATALOADER_ENTRY, raising=False)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "REPLICA_INDEX", "REPLICA_SIZE"):
        monkeypatch.delenv(key, raising=False)
    reset_embedded_job()
    yield
    reset_embedded_job()


def _limits(loader: DataLoader, ctx) -> tuple[int | None, int | None]:
    """(staleness permits, window cap) of a running iteration of ``loader`` in ``ctx``."""
    prefetcher = loader._prefetcher(ctx).start()
    try:
        limits = prefetcher._limits
        assert limits is not None
        window = None if limits.lookahead is None else limits.lookahead.window_cap
        return limits.staleness, window
    finally:
        prefetcher.close()


def test_a_training_loop_at_defaults_runs_under_the_automatic_bound(embedded_job):
    model = SmallModel()
    with TrainCtx(
        Adagrad(lr=0.05), torch.optim.Adam(model.parameters()), model=model, mixed_precision=False
    ) as ctx:
        auto = AUTO_EMBEDDING_STALENESS
        assert _limits(DataLoader(Batches()), ctx) == (auto, auto)
        assert _limits(DataLoader(Batches(), embedding_staleness=3), ctx) == (3, 3)
        steps = 0
        for batch in DataLoader(Batches()):  # the README's loop trains under it
            output, labels = ctx.forward(batch)
            ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
            steps += 1
        assert steps == 4
    with eval_ctx(model=model) as ectx:  # evaluation takes no permits
        assert _limits(DataLoader(Batches()), ectx) == (None, None)
