"""Rank 0's TensorBoard run has the PS side of the job (pyrsia/services/nn_worker/ps_curves.py):
``ps/entries`` and the hit/admit/evict rates, read from a real PS's /metrics over loopback."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
import uuid

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import SGD
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.nn_worker import ps_curves, tensorboard
from pyrsia.services.nn_worker.ps_curves import PSCurves
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.embedding_spec import EmbeddingHyperparams
from pyrsia.shared.registry import RegistrySettings
from pyrsia.shared.settings import Settings
from tests.nn_helpers import SmallModel, environ, job_services, make_batch

STEPS = 6
PS_TAGS = ("ps/entries", "ps/hit_rate", "ps/admit_rate", "ps/evict_rate")


class SlowDataset(IterableDataset):
    """The batches, one every ``pause_s``: the job spans several PS points."""

    def __init__(self, batches, pause_s: float):
        super().__init__(buffer_size=2)
        self.batches, self.pause_s = batches, pause_s

    def __iter__(self):
        for batch in self.batches:
            time.sleep(self.pause_s)
            yield batch


@pytest.fixture
def job(redis_server, tmp_path, monkeypatch):
    monkeypatch.setattr(ps_curves, "PS_POLL_INTERVAL_S", 0.2)
    monkeypatch.setattr(tensorboard, "FLUSH_INTERVAL_S", 0.2)
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"psc-{uuid.uuid4().hex[:8]}"}
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None, PERSIA_TENSORBOARD_DIR=None):
        with job_services(env, tmp_path / "svc"):
            yield env


def _scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_ps_curves_of_a_real_job(job, tmp_path):
    """ps/entries ends at the number of distinct ids sent (slot a and slot r are stored
    apart: feature_index_prefix_bit); hit_rate is in [0, 1], the rates finite and >= 0."""
    model = SmallModel()
    # ids repeat from batch to batch: later lookups hit
    id_lists = [[1, 2, 3 + k] for k in range(STEPS)]
    batches = [make_batch(ids, seed=k) for k, ids in enumerate(id_lists)]
    slot_a = {i for ids in id_lists for i in ids}
    slot_r = {j for ids in id_lists for i in ids for j in (i, i + 1)}
    with TrainCtx(
        SGD(lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        mixed_precision=False,
        tensorboard_dir=tmp_path / "tb",
    ) as ctx:
        for batch in DataLoader(SlowDataset(batches, pause_s=0.3), embedding_staleness=1):
            output, labels = ctx.forward(batch)
            ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
    scalars = _scalars(tmp_path / "tb" / job["PERSIA_JOB_ID"] / "rank_0")
    for tag in PS_TAGS:
        assert tag in scalars, (tag, sorted(scalars))
        assert all(math.isfinite(v) and v >= 0 for _, v in scalars[tag]), (tag, scalars[tag])
    entries = scalars["ps/entries"]
    assert len(entries) >= 3, entries  # as it starts, at least one 0.2 s point, at close
    assert entries[-1] == (STEPS, len(slot_a) + len(slot_r))
    assert [s for s, _ in entries] == sorted(s for s, _ in entries)
    assert all(0 <= v <= 1 for _, v in scalars["ps/hit_rate"])
    assert max(v for _, v in scalars["ps/hit_rate"]) > 0  # ids 1 and 2 come back every batch
    assert max(v for _, v in scalars["ps/admit_rate"]) > 0
    assert all(v == 0 for _, v in scalars["ps/evict_rate"])  # far below the PS capacity


def test_a_silent_ps_is_left_out_of_the_point(redis_server, tmp_path, caplog):
    """A registered replica that accepts connections and never answers (SIGSTOP) costs one
    scrape timeout and one debug line naming it; the point holds the replica that answered."""
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"psc-{uuid.uuid4().hex[:8]}"}
    with environ(**env), job_services(env, tmp_path / "svc", ps_replicas=2) as procs:
        ps = [p for p in procs if p.role == ROLE_EMBEDDING_PS]
        curves = PSCurves(RegistrySettings.from_env(Settings.from_env(env)))
        assert set(curves.poll()) == {"ps/entries"}  # both answer: no rate from one reading
        silent = ps[1]
        os.kill(silent.proc.pid, signal.SIGSTOP)
        try:
            with caplog.at_level(logging.DEBUG, logger=ps_curves.__name__):
                started = time.monotonic()
                point = curves.poll()
                took = time.monotonic() - started
        finally:
            os.kill(silent.proc.pid, signal.SIGCONT)
    # replica 0 answered: entries, and rates from its two readings (nothing looked up)
    assert point == {"ps/entries": 0.0, "ps/admit_rate": 0.0, "ps/evict_rate": 0.0}
    assert ps_curves.SCRAPE_TIMEOUT_S <= took < ps_curves.SCRAPE_TIMEOUT_S + 3, took
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and silent.address in skipped[0], skipped


def test_the_store_counts_every_looked_up_id_once():
    """hits + admitted + refused = ids looked up for training; a duplicate of a new id in one
    call is a hit; a full store evicts one entry per admission; eval lookups count nothing."""
    store = EmbeddingStore(capacity=4)
    store.lookup(np.array([1, 2, 3, 1, 5, 6], dtype=np.uint64), 4, train=True)
    assert store.lookup_counters() == {"hits": 1, "admitted": 5, "refused": 0, "evicted": 1}
    sharded = EmbeddingStore(capacity=64, num_shards=4)  # each shard holds 16
    ids = np.random.default_rng(0).integers(0, 200, size=500).astype(np.uint64)
    sharded.lookup(ids, 4, train=True)
    c = sharded.lookup_counters()
    assert c["hits"] + c["admitted"] + c["refused"] == ids.size
    assert c["admitted"] - c["evicted"] == len(sharded) and c["evicted"] > 0
    store.lookup(np.array([1, 2, 3, 5, 6, 7], dtype=np.uint64), 4, train=False)
    assert store.lookup_counters()["hits"] == 1
    refusing = EmbeddingStore(capacity=8, hyperparams=EmbeddingHyperparams(admit_probability=0.0))
    refusing.lookup(np.array([1, 2, 2], dtype=np.uint64), 4, train=True)
    assert refusing.lookup_counters() == {"hits": 0, "admitted": 0, "refused": 3, "evicted": 0}
    assert len(refusing) == 0
