"""Embedded mode's in-process client (pyrsia/services/embedded/client.py) against the
real services: the same answers, the same updates, and checkpoints that load both ways.

Both sides run the same calls through their client's coroutines: the HTTP side is an
``EmbeddingWorkerClient`` talking to a real embedding worker and PS (loopback, real Redis), the
embedded side an ``EmbeddedClient`` built from the same YAML files.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from persia.embedding.data import IDTypeFeature, IDTypeFeatureWithSingleID, Label, PersiaBatch
from pyrsia.services.embedded.client import EmbeddedClient
from pyrsia.services.nn_worker.embedding_client import EmbeddingWorkerClient
from pyrsia.shared.config import load_embedding_config, load_global_config
from pyrsia.shared.errors import InvalidInputError, NotFoundError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry
from tests.test_embedding_worker_service import configs, start_cluster

__all__ = ["configs"]  # the fixture, re-used

HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
ADAGRAD = {"type": "adagrad", "lr": 0.1, "initial_accumulator_value": 0.01, "eps": 1e-10}


def batch(seed: int, n: int = 6, requires_grad: bool = True) -> PersiaBatch:
    """The worker service tests' three slots: single id, summed with sqrt scaling, raw."""
    rng = np.random.default_rng(seed)
    tags = [rng.integers(0, 20, size=k, dtype=np.uint64) for k in rng.integers(0, 4, size=n)]
    seq = [rng.integers(0, 20, size=k, dtype=np.uint64) for k in rng.integers(0, 6, size=n)]
    return PersiaBatch(
        [
            IDTypeFeatureWithSingleID("user", rng.integers(0, 30, size=n, dtype=np.uint64)),
            IDTypeFeature("tags", tags),
            IDTypeFeature("seq", seq),
        ],
        labels=[Label(np.zeros((n, 1), np.float32))] if requires_grad else None,
        requires_grad=requires_grad,
    )


def arrays(embeddings) -> dict[str, np.ndarray]:
    """Every slot's tensor of an answer (a gathered slot's made from its table)."""
    return {name: np.asarray(data) for name, data in embeddings.embeddings}


def embedded(flags: list[str]) -> EmbeddedClient:
    """An EmbeddedClient from the ``--embedding-config`` / ``--global-config`` flags."""
    emb, glob = flags[1], flags[3]
    return EmbeddedClient(load_embedding_config(emb), load_global_config(glob))


async def train_steps(client, steps: int, *, gathered: bool) -> list[dict[str, np.ndarray]]:
    """Configure, register Adagrad, then ``steps`` training lookups each followed by its
    gradients (a fixed function of the answer), and one eval lookup; every answer's arrays."""
    await client.configure(HYPER)
    await client.register_optimizer(ADAGRAD)
    seen = []
    for step in range(steps):
        answer, worker = await client.lookup_direct(
            batch(step % 3).id_part(), True, gathered=gathered
        )
        got = arrays(answer)
        seen.append(got)
        assert answer.batch_id is not None and answer.batch_id < 0
        grads = [(name, np.sin(data) + 0.25) for name, data in answer.embeddings]
        if gathered:
            grads = [(n, g) for n, g in grads if n not in set(answer.embeddings.tables[0].slots)]
            tables = [(t.dim, np.cos(t.data)) for t in answer.embeddings.tables]
            applied = await client.gradients(worker, answer.batch_id, 2.0, grads, tables=tables)
        else:
            applied = await client.gradients(worker, answer.batch_id, 2.0, grads)
        assert applied.totals.applied > 0 and applied.skipped_slots == ()
    final, _ = await client.lookup_direct(batch(7, requires_grad=False).id_part(), False)
    seen.append(arrays(final))
    return seen


@pytest.mark.parametrize("gathered", [False, True])
async def test_embedded_client_answers_and_updates_as_the_services_do(
    services, configs, registry_settings, gathered
):
    flags = configs()
    start_cluster(services, flags, n_ps=1)
    http = HttpClient(retries=0)
    registry = Registry(registry_settings)
    try:
        remote = EmbeddingWorkerClient(http, registry=registry)
        await remote.connect()
        await remote.wait_ready()
        want = await train_steps(remote, 5, gathered=gathered)
        remote_stats = await remote.stats()
    finally:
        await http.close()
        await registry.close()
    local = embedded(flags)
    try:
        got = await train_steps(local, 5, gathered=gathered)
        local_stats = await local.stats()
    finally:
        local.close()
    assert len(got) == len(want) == 6
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.keys() == w.keys()
        for name in w:
            np.testing.assert_allclose(
                g[name], w[name], rtol=1e-6, atol=1e-7, err_msg=f"{step}/{name}"
            )
    # the updates moved the vectors: the last lookup differs from the first of the same ids
    assert not np.allclose(got[3]["user"], got[0]["user"])
    assert local_stats.ps[0].entries == remote_stats.ps[0].entries > 0
    assert local_stats.ps[0].updates_applied == remote_stats.ps[0].updates_applied > 0
    # nothing reads an embedded worker's Prometheus metrics: it keeps none (the same answers)
    assert local.worker.metrics is None and next(local.worker.lookups) == 0


async def test_a_checkpoint_moves_between_embedded_and_services_mode_both_ways(
    services, configs, registry_settings, tmp_path
):
    flags = configs()
    start_cluster(services, flags, n_ps=2)  # two PS replicas: the files are re-sharded on load
    probe = batch(11, requires_grad=False).id_part()
    http = HttpClient(retries=0)
    registry = Registry(registry_settings)
    local = embedded(flags)
    try:
        remote = EmbeddingWorkerClient(http, registry=registry)
        await remote.connect()
        await remote.wait_ready()
        # embedded -> services
        await train_steps(local, 4, gathered=False)
        await local.dump(str(tmp_path / "from_embedded"))
        await remote.configure(HYPER)
        await remote.load(str(tmp_path / "from_embedded"))
        expected = arrays((await local.lookup_direct(probe, False))[0])
        loaded = arrays((await remote.lookup_direct(probe, False))[0])
        for name in expected:
            np.testing.assert_array_equal(loaded[name], expected[name], err_msg=name)
        assert np.abs(expected["user"]).max() > 0
        # services -> embedded: train the services side on, dump, load into a fresh engine
        await remote.register_optimizer(ADAGRAD)
        await train_steps(remote, 3, gathered=False)
        await remote.dump(str(tmp_path / "from_services"))
        expected = arrays((await remote.lookup_direct(probe, False))[0])
    finally:
        await http.close()
        await registry.close()
        local.close()
    fresh = embedded(flags)
    try:
        answer = await fresh.load(str(tmp_path / "from_services"))
        assert answer["replicas"][0]["entries"] > 0
        loaded = arrays((await fresh.lookup_direct(probe, False))[0])
    finally:
        fresh.close()
    for name in expected:
        np.testing.assert_array_equal(loaded[name], expected[name], err_msg=name)


async def test_embedded_client_refuses_what_the_routes_refuse(configs):
    local = embedded(configs())
    try:
        await local.configure(HYPER)
        await local.register_optimizer(ADAGRAD)
        with pytest.raises(NotFoundError, match="unknown"):
            await local.lookup(0, 12345, True, 6)  # never buffered
        answer, worker = await local.lookup_direct(batch(0).id_part(), True)
        bad = [("user", np.zeros((2, 4), np.float32))]
        with pytest.raises(InvalidInputError, match="gradients.user"):
            await local.gradients(worker, answer.batch_id, 1.0, bad)
        # a refused body leaves the batch waiting for a corrected one
        good = [(name, np.ones_like(data)) for name, data in answer.embeddings]
        assert (await local.gradients(worker, answer.batch_id, 1.0, good)).totals.applied > 0
        with pytest.raises(NotFoundError):  # consumed once
            await local.gradients(worker, answer.batch_id, 1.0, good)
        with pytest.raises(InvalidInputError, match="worker"):
            await local.lookup(1, 0, True, 6)
        with pytest.raises(InvalidInputError, match="optimizer.type"):
            await local.register_optimizer({"type": "lamb"})
        with pytest.raises(InvalidInputError, match="dir"):
            await local.load("/proc/version/not-a-dir")
    finally:
        local.close()


def test_registering_the_optimizer_loads_the_kernels_the_first_batches_need(tmp_path):
    """An embedded job loads its PS optimizer's and the worker's compiled kernels when the
    optimizer is registered, before the first batch (a fresh process: none loaded before)."""
    emb = tmp_path / "embedding_config.yml"
    emb.write_text("slots_config:\n  user: {dim: 4}\n")
    glob = tmp_path / "global_config.yml"
    glob.write_text("common_config:\n  job_type: Train\n")
    script = f"""
import asyncio, json
from pyrsia.services.embedding_ps import kernels as ps
from pyrsia.services.embedding_worker import kernels as ew
from pyrsia.services.embedded.client import EmbeddedClient
from pyrsia.shared.config import load_embedding_config, load_global_config
kernels = [ps.update_rows, ps.lookup_train, ew.dedup_prefixed, ew.all_finite]
before = [len(k.signatures) for k in kernels]
client = EmbeddedClient(load_embedding_config({str(emb)!r}), load_global_config({str(glob)!r}))
asyncio.run(client.register_optimizer({ADAGRAD!r}))
print(json.dumps([before, [len(k.signatures) for k in kernels]]))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()[-1]
    before, after = json.loads(out)
    assert before == [0, 0, 0, 0]
    assert all(n >= 1 for n in after)
