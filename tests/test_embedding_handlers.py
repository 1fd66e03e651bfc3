"""The worker side of the embedding routes is one table (embedding_worker/handlers.py).

Every route of ``ROUTES`` has its handler in ``HANDLERS``, bound to that very route; the
embedding worker's HTTP app serves every one of them, and the in-process transport answers
every one, both from the table. A route without a handler fails, naming it, wherever the
table is read. (``tests/test_embedding_transport.py`` runs every route through both.)
"""

from __future__ import annotations

import pytest

from pyrsia.services.embedded.transport import InProcessTransport
from pyrsia.services.embedding_worker.handlers import HANDLERS, check_handlers
from pyrsia.services.embedding_worker.ps_client import PSClient
from pyrsia.services.embedding_worker.server import create_app
from pyrsia.shared.config import load_embedding_config, load_global_config
from pyrsia.shared.embedding_transport import ROUTES, STATS, Route
from pyrsia.shared.errors import MisuseError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.settings import Settings
from tests.test_embedding_worker_service import configs

__all__ = ["configs"]  # the fixture, re-used


def test_every_route_has_its_handler_in_the_table():
    for route in ROUTES:
        assert route.path in HANDLERS, f"{route.path} has no handler"
        assert HANDLERS[route.path].route is route, route.path
    assert set(HANDLERS) == {route.path for route in ROUTES}
    check_handlers()


def test_a_route_without_a_handler_is_named():
    lacking = {path: h for path, h in HANDLERS.items() if path != STATS.path}
    with pytest.raises(MisuseError, match="no embedding-worker handler for the route.* /stats"):
        check_handlers(lacking)
    rebalance = Route("/rebalance", dict, lambda answer, _: answer, 1.0)
    with pytest.raises(MisuseError, match="/rebalance"):
        check_handlers(HANDLERS, (*ROUTES, rebalance))
    misbound = {**HANDLERS, STATS.path: HANDLERS["/schema"]}  # the path of another route
    with pytest.raises(MisuseError, match="/stats"):
        check_handlers(misbound)


async def test_both_transports_serve_every_route_of_the_table(configs):
    flags = configs()
    schema, config = load_embedding_config(flags[1]), load_global_config(flags[3])
    http = HttpClient()
    try:
        ps = PSClient(None, http, addresses=("127.0.0.1:1",))
        app = create_app(
            index=0,
            schema=schema,
            config=config.embedding_worker_config,
            ps=ps,
            ps_wait_timeout_s=1,
            settings=Settings.from_env({}),
        )
        posts = {r.resource.canonical for r in app.router.routes() if r.method == "POST"}
    finally:
        await http.close()
    assert posts == {"/batch", *HANDLERS}
    engines = InProcessTransport(schema, config)
    try:
        assert engines.routes == frozenset(HANDLERS)
    finally:
        engines.close()
