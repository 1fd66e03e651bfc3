"""Embedding gradients carried on the next ``/lookup`` (pyrsia/services/nn_worker/carry.py).

A real embedding worker and PS on loopback, a real Redis: a lookup that carries a batch's
gradients applies them once, before it reads, exactly as ``/gradients`` followed by
``/lookup`` does; gradients no lookup takes, or whose carrying lookup failed, go alone on
``/gradients`` (which keeps answering); and a services-mode training loop at
``embedding_staleness=1`` carries its gradients and reads every batch after its predecessor's
update.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
import torch

from persia.ctx import TrainCtx
from persia.data import DataLoader, StreamingDataset
from persia.embedding.optim import SGD
from pyrsia.services.embedded.transport import InProcessTransport
from pyrsia.services.nn_worker.embedding_client import EmbeddingClient
from pyrsia.services.nn_worker.http_transport import HttpEmbeddingTransport
from pyrsia.shared import embedding_transport as routes
from pyrsia.shared.config import load_embedding_config, load_global_config
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.errors import InvalidInputError, NotFoundError, ProtocolError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.settings import Settings
from pyrsia.shared.warming import warming_in_progress
from pyrsia.shared.wire.worker import Embeddings, Gradients, Lookup, PutBatch
from tests.nn_helpers import SmallModel, environ, job_services, make_batch
from tests.test_embedded_client import ADAGRAD, HYPER, arrays, batch
from tests.test_embedding_worker_service import configs, start_cluster

__all__ = ["configs"]  # the fixture, re-used


def _gradients(answer: Embeddings, batch_id: int) -> Gradients:
    """A gradient body for every slot of ``answer`` (gathered slots as table sums)."""
    gathered = {name for t in answer.tables for name in t.slots}
    slots = tuple(
        (name, np.full_like(np.asarray(d), 0.5))
        for name, d in answer.embeddings
        if name not in gathered
    )
    tables = tuple((t.dim, np.full_like(t.data, 0.25)) for t in answer.tables) or None
    return Gradients(batch_id, 1.0, slots, tables)


@asynccontextmanager
async def _looked_up_first(
    flags,
) -> AsyncIterator[tuple[InProcessTransport, EmbeddingClient, Embeddings]]:
    """In-process engines, configured, with batches 1 and 2 (the same ids) buffered and
    batch 1 looked up for training: (engines, client, batch 1's answer)."""
    engines = InProcessTransport(load_embedding_config(flags[1]), load_global_config(flags[3]))
    client = EmbeddingClient(engines)
    try:
        await client.configure(HYPER)
        await client.register_optimizer(ADAGRAD)
        for k in (1, 2):
            engines.worker.forward.put(k, 0, engines.worker.prepare(batch(0).id_part()))
        first, _ = await client.lookup(0, 1, True, 6, gathered=True)
        yield engines, client, first
    finally:
        client.close()


async def _reference(flags, *, carried: bool = False) -> dict[str, np.ndarray]:
    """What batch 2 reads after batch 1's gradients went on ``/gradients`` (in process), or
    with ``carried`` on batch 2's lookup through the in-process transport."""
    async with _looked_up_first(flags) as (engines, client, first):
        if carried:
            request = Lookup(2, True, True, (_gradients(first, 1),))
            second = await engines.call(0, routes.LOOKUP, request, 6)
            assert [a.batch_id for a in second.applied] == [1] and second.applied[0].totals.applied
        else:
            await client.send_gradients(0, _gradients(first, 1))
            second, _ = await client.lookup(0, 2, True, 6, gathered=True)
        return arrays(second)


async def test_the_in_process_transport_applies_carried_gradients_too(configs):
    flags = configs()
    want, got = await _reference(flags), await _reference(flags, carried=True)
    for name, data in got.items():
        np.testing.assert_array_equal(data, want[name], err_msg=name)


async def test_a_refused_carried_body_fails_the_lookup_after_applying_those_before_it(configs):
    """Carried bodies go to the PS with the lookup's own requests; one the worker refuses
    (an unknown batch) fails the lookup, those before it are applied as /gradients would
    apply them, and the looked-up batch stays buffered."""
    async with _looked_up_first(configs()) as (engines, client, first):
        request = Lookup(2, True, True, (_gradients(first, 1), Gradients(77, 1.0, ())))
        with pytest.raises(NotFoundError):
            await engines.call(0, routes.LOOKUP, request, 6)
        assert engines.ps.applied_updates > 0  # batch 1's gradients
        assert 1 not in engines.worker.awaiting and 2 in engines.worker.forward
        second, _ = await client.lookup(0, 2, True, 6, gathered=True)
        assert second.batch_id == 2


async def _ps_update_requests(http: HttpClient, registry: Registry) -> float:
    """``/update`` requests the one PS replica has served (its /metrics)."""
    (record,) = (await registry.discover(ROLE_EMBEDDING_PS)).values()
    async with http._get_session().get(f"{record.url}/metrics") as resp:
        text = await resp.text()
    name = 'pyrsia_ps_request_seconds_count{op="update"} '
    return next((float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name)), 0.0)


async def test_a_lookup_carries_gradients_applied_once_before_it_reads(
    services, configs, registry_settings
):
    flags = configs()
    start_cluster(services, flags, n_ps=1)
    http, registry = HttpClient(retries=0), Registry(registry_settings)
    client = EmbeddingClient(HttpEmbeddingTransport(http, registry=registry))
    try:
        url = (await client.connect())[0]
        await client.wait_ready()
        await client.configure(HYPER)
        await client.register_optimizer(ADAGRAD)
        for k in (1, 2, 3):  # the same ids each time: every lookup reads what came before
            await http.call(f"{url}/batch", PutBatch(0, k, batch(0).id_part()).to_wire())
        first, _ = await client.lookup(0, 1, True, 6, gathered=True, carry=True)
        before = (await client.stats()).ps[0].updates_applied
        kept = client.carry_gradients(0, _gradients(first, 1))
        assert kept is not None and not kept.done()
        second, _ = await client.lookup(0, 2, True, 6, gathered=True, carry=True)
        applied = await kept
        assert applied.batch_id == 1 and applied.totals.applied > 0
        assert second.applied == (applied,)
        assert (await client.stats()).ps[0].updates_applied == before + applied.totals.applied
        assert await _ps_update_requests(http, registry) == 0  # went on the PS /lookup too
        assert client.carrier is not None and (client.carrier.carried, client.carrier.alone) == (
            1,
            0,
        )
        want = await _reference(flags)
        for name, data in arrays(second).items():
            np.testing.assert_allclose(data, want[name], rtol=1e-6, atol=1e-7, err_msg=name)
        with pytest.raises(NotFoundError):  # applied once: the worker forgot the batch
            await client.send_gradients(0, _gradients(first, 1))
        # the separate route keeps answering: batch 2's gradients on /gradients
        assert (await client.send_gradients(0, _gradients(second, 2))).totals.applied > 0
        # a carrying lookup that fails (unknown batch) sends what it carried alone
        third, _ = await client.lookup(0, 3, True, 6, gathered=True, carry=True)
        kept = client.carry_gradients(0, _gradients(third, 3))
        assert kept is not None
        with pytest.raises(NotFoundError):
            await client.lookup(0, 99, True, 6, gathered=True, carry=True)
        assert (await kept).totals.applied > 0 and client.carrier.alone == 1
        # kept gradients that no lookup takes go alone after the wait
        await http.call(f"{url}/batch", PutBatch(0, 4, batch(0).id_part()).to_wire())
        fourth, _ = await client.lookup(0, 4, True, 6, gathered=True, carry=True)
        client.carrier.wait_s = 0.05
        kept = client.carry_gradients(0, _gradients(fourth, 4))
        assert kept is not None
        assert (await asyncio.wait_for(kept, 5)).batch_id == 4 and client.carrier.alone == 2
    finally:
        await http.close()
        await registry.close()


def test_carried_bodies_are_checked_naming_the_field():
    body = Lookup(1, True, True, (Gradients(3, 1.0, ()),)).to_wire()
    assert Lookup.from_wire(body).carried[0].batch_id == 3
    body["gradients"][0]["batch_id"] = "x"
    with pytest.raises(InvalidInputError) as err:
        Lookup.from_wire(body)
    assert err.value.field == "gradients[0].batch_id"
    with pytest.raises(InvalidInputError, match="gradients"):
        Lookup.from_wire({"batch_id": 1, "train": True, "gradients": {"a": 1}})
    answer = {"batch_id": 1, "requires_grad": True, "embeddings": [], "applied": [{"x": 1}]}
    with pytest.raises(ProtocolError):
        Embeddings.from_wire(answer)


async def _feed(n_batches: int) -> None:
    """A data loader: every batch with the same ids, to worker 0 and to rank 0's ingress."""
    from pyrsia.shared.constants import ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER

    registry = Registry(RegistrySettings.from_env(Settings.from_env()))
    client = HttpClient()
    try:
        worker = (await registry.wait_for(ROLE_EMBEDDING_WORKER, timeout_s=30))[0]
        rank0 = (await registry.wait_for(ROLE_NN_WORKER, timeout_s=30))[0]
        for k in range(n_batches):
            b = make_batch([7, 8], seed=k)
            await client.call(f"{worker.url}/batch", PutBatch(0, k, b.id_part()).to_wire())
            dense = {"loader": 0, "batch_id": k, "worker": 0, "dense": b.dense_part().to_wire()}
            await client.call(f"{rank0.url}/ingress", dense, until=1e12)
        await client.call(f"{rank0.url}/done", {"loader": 0, "loader_count": 1, "sent": n_batches})
    finally:
        await client.close()
        await registry.close()


def test_training_carries_gradients_and_reads_each_batch_after_the_last_update(
    redis_server, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="pyrsia.services.nn_worker.backward")
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"carry-{uuid.uuid4().hex[:8]}"}
    n_batches = 6
    errors: list[BaseException] = []
    feeder = threading.Thread(target=lambda: errors.extend(_run(_feed(n_batches))))
    with environ(**env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"), job_services(env, tmp_path):
        from persia import env as persia_env

        persia_env.reload_env()
        model, read, classes = SmallModel(), [], []
        with TrainCtx(SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model) as ctx:
            loop_thread = ctx.session.runtime.native_id
            deadline = time.monotonic() + 60
            while warming_in_progress() and time.monotonic() < deadline:  # the kernel warm-up
                time.sleep(0.05)
            feeder.start()
            loader = DataLoader(StreamingDataset(buffer_size=2), embedding_staleness=1)
            for b in loader:
                classes.append(os.sched_getscheduler(loop_thread))
                output, labels = ctx.forward(b)
                read.append(ctx._current_embeddings[0][1].detach().clone())  # slot "a"
                ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
            classes.append(os.sched_getscheduler(loop_thread))
            client = ctx.session.client
            ctx.wait_for_gradients()
            stats = ctx.session.runtime.run(client.stats())
        feeder.join()
        persia_env.reload_env()
    assert not errors, errors
    # the loop thread in the idle class while the training loop ran, the default one after it
    assert classes == [os.SCHED_IDLE] * n_batches + [os.SCHED_OTHER]
    assert client.carrier is not None and client.carrier.carried >= n_batches - 2
    assert client.carrier.carried + client.carrier.alone == n_batches
    # bound 1: each batch reads its predecessor's update (same ids, so every read differs)
    assert all(not torch.equal(a, b) for a, b in zip(read, read[1:], strict=False))
    # applied exactly once each: the batch's 5 rows (ids 7, 8 in "a"; 7, 8, 9 in "r")
    assert stats.ps[0].updates_applied == n_batches * stats.ps[0].entries == n_batches * 5
    # flushed twice (wait_for_gradients, then the context's exit) with nothing sent between:
    # the counts are logged once
    counts = [r for r in caplog.records if "embedding gradients so far" in r.getMessage()]
    assert len(counts) == 1, [r.getMessage() for r in counts]


def _run(coro) -> list[BaseException]:
    try:
        asyncio.run(coro)
    except BaseException as exc:  # reported by the test
        return [exc]
    return []


async def test_a_lookup_to_another_worker_waits_for_the_gradients_kept_for_the_first(
    services, configs, registry_settings
):
    flags = configs()
    start_cluster(services, flags, n_ps=1, n_workers=2)
    http, registry = HttpClient(retries=0), Registry(registry_settings)
    client = EmbeddingClient(HttpEmbeddingTransport(http, registry=registry))
    try:
        urls = await client.connect()
        await client.wait_ready()
        await client.configure(HYPER)
        await client.register_optimizer(ADAGRAD)
        for worker, url in enumerate(urls):
            await http.call(f"{url}/batch", PutBatch(0, worker, batch(0).id_part()).to_wire())
        first, _ = await client.lookup(0, 0, True, 6, gathered=True, carry=True)
        kept = client.carry_gradients(0, _gradients(first, 0))
        assert kept is not None
        second, _ = await client.lookup(1, 1, True, 6, gathered=True, carry=True)
        assert kept.done() and kept.result().totals.applied > 0  # applied before worker 1 read
        assert second.applied == () and client.carrier is not None
        assert (client.carrier.carried, client.carrier.alone) == (0, 1)
        moved = [
            not np.array_equal(a, b)
            for a, b in zip(arrays(first).values(), arrays(second).values(), strict=True)
        ]
        assert all(moved)  # the same ids, read after batch 0's update
    finally:
        await http.close()
        await registry.close()
