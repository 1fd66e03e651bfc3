"""The embedding transport protocol (pyrsia/shared/embedding_transport.py): one client, two
transports, the same answers; a transport that lacks a route fails at once, naming it.

The same :class:`EmbeddingClient` code runs every route over the HTTP transport (a real
embedding worker and PS on loopback, real Redis) and over the in-process transport (the same
engines in this process, built from the same YAML files).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyrsia.services.embedded.transport import InProcessTransport
from pyrsia.services.nn_worker.embedding_client import EmbeddingClient
from pyrsia.services.nn_worker.http_transport import HttpEmbeddingTransport
from pyrsia.shared.config import load_embedding_config, load_global_config
from pyrsia.shared.embedding_transport import ROUTES, SCHEMA, STATS, Route
from pyrsia.shared.errors import MisuseError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry
from pyrsia.shared.wire.admin import Empty
from pyrsia.shared.wire.worker import PutBatch
from tests.test_embedded_client import ADAGRAD, HYPER, arrays, batch
from tests.test_embedding_worker_service import configs, start_cluster

__all__ = ["configs"]  # the fixture, re-used


class Recording:
    """A transport that passes every call on and notes its route (which routes a test ran)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.routes = inner.routes
        self.called: set[str] = set()

    @property
    def addresses(self) -> list[str]:
        return self.inner.addresses

    async def connect(self) -> list[str]:
        return await self.inner.connect()

    async def refresh(self) -> None:
        await self.inner.refresh()

    async def address(self, worker: int) -> str:
        return await self.inner.address(worker)

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        await self.inner.wait_ready(timeout_s)

    async def call(self, worker: int, route: Route, request: Any, batch_size: int | None = None):
        self.called.add(route.path)
        return await self.inner.call(worker, route, request, batch_size)

    def close(self) -> None:
        self.inner.close()


async def every_route(client: EmbeddingClient, put, tmp) -> dict[str, Any]:
    """Every client call, in a fixed order: what each answered (arrays and counters)."""
    out: dict[str, Any] = {}
    await client.wait_ready()
    await client.configure(HYPER)
    await client.register_optimizer(ADAGRAD)
    out["schema"] = (await client.schema()).schema.to_dict()
    by_route = await client.call(SCHEMA, Empty())  # any route, without a named method
    assert by_route.schema.to_dict() == out["schema"] and by_route.ps_replicas == 1
    await put(3, batch(0))  # what a data loader does: the batch's ids buffered on worker 0
    buffered, trainable = await client.lookup(0, 3, True, 6)
    assert trainable and buffered.batch_id == 3
    out["buffered"] = arrays(buffered)
    grads = [(name, np.sin(data) + 0.25) for name, data in buffered.embeddings]
    out["applied"] = (await client.gradients(0, 3, 2.0, grads)).totals.applied
    direct, worker = await client.lookup_direct(batch(1).id_part(), True, gathered=True)
    out["direct"] = arrays(direct)
    tables = [(t.dim, np.cos(t.data)) for t in direct.tables]
    slots = {name for t in direct.tables for name in t.slots}
    rest = [(name, np.ones_like(d)) for name, d in direct.embeddings if name not in slots]
    assert direct.batch_id is not None
    done = await client.gradients(worker, direct.batch_id, 1.0, rest, tables=tables)
    out["applied_gathered"] = done.totals.applied
    out["after"] = arrays((await client.lookup_direct(batch(0).id_part(), False))[0])
    stats = await client.stats()
    out["entries"], out["updates"] = stats.ps[0].entries, stats.ps[0].updates_applied
    await client.dump(str(tmp / "ckpt"))
    await client.clear()
    out["cleared"] = (await client.stats()).ps[0].entries
    await client.load(str(tmp / "ckpt"))
    out["loaded"] = arrays((await client.lookup_direct(batch(0).id_part(), False))[0])
    return out


async def test_one_client_over_both_transports_answers_the_same(
    services, configs, registry_settings, tmp_path
):
    flags = configs()
    start_cluster(services, flags, n_ps=1)
    http, registry = HttpClient(retries=0), Registry(registry_settings)
    try:
        remote = Recording(HttpEmbeddingTransport(http, registry=registry))
        url = (await remote.connect())[0]

        async def post(batch_id, b):
            await http.call(f"{url}/batch", PutBatch(0, batch_id, b.id_part()).to_wire())

        want = await every_route(EmbeddingClient(remote), post, tmp_path / "http")
    finally:
        await http.close()
        await registry.close()
    engines = InProcessTransport(load_embedding_config(flags[1]), load_global_config(flags[3]))
    local = Recording(engines)

    async def put(batch_id, b):
        engines.worker.forward.put(batch_id, 0, engines.worker.prepare(b))

    try:
        got = await every_route(EmbeddingClient(local), put, tmp_path / "local")
    finally:
        local.close()
    assert remote.called == local.called == {route.path for route in ROUTES}
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, dict) and key != "schema":
            assert got[key].keys() == value.keys(), key
            for name in value:
                np.testing.assert_allclose(
                    got[key][name], value[name], rtol=1e-6, atol=1e-7, err_msg=f"{key}/{name}"
                )
        else:
            assert got[key] == value, key
    assert want["applied"] > 0 and want["cleared"] == 0 < want["entries"]
    np.testing.assert_array_equal(got["loaded"]["user"], got["after"]["user"])


def test_a_transport_that_lacks_a_route_fails_when_a_client_is_built_on_it(configs):
    flags = configs()
    engines = InProcessTransport(load_embedding_config(flags[1]), load_global_config(flags[3]))
    try:
        EmbeddingClient(engines)  # every route: fine
        del engines.handlers[STATS.path]
        engines.routes = frozenset(engines.handlers)
        with pytest.raises(MisuseError, match="InProcessTransport lacks the embedding route"):
            EmbeddingClient(engines)
        with pytest.raises(MisuseError, match="/stats"):
            EmbeddingClient(engines)
    finally:
        engines.close()
    with pytest.raises(MisuseError, match="object is not an embedding transport"):
        EmbeddingClient(object())  # type: ignore[arg-type]


async def test_a_call_on_a_route_the_in_process_transport_lacks_names_it(configs):
    flags = configs()
    engines = InProcessTransport(load_embedding_config(flags[1]), load_global_config(flags[3]))
    try:
        unknown = Route("/rebalance", dict, lambda answer, _: answer, 1.0)
        with pytest.raises(MisuseError, match="no route /rebalance"):
            await engines.call(0, unknown, {})
    finally:
        engines.close()
