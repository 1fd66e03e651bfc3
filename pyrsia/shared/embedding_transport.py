"""The embedding transport protocol: how an embedding client reaches the embedding workers.

The NN worker's embedding client (``pyrsia/services/nn_worker/embedding_client.py``) is
written once against :class:`EmbeddingTransport`, the way httpx's ``Client`` is written
against ``BaseTransport``; two transports implement it::

    EmbeddingClient ── call(worker, route, request) ─┬─▶ HttpEmbeddingTransport
      call(route, request), and lookup,               │    (nn_worker/http_transport.py): the
      lookup_direct, gradients, configure,            │    request's wire form, msgpack, POST to
      register_optimizer, dump, load, clear,          │    the worker's route, the answer checked
      schema, stats                                   └─▶ InProcessTransport
                                                           (embedded/transport.py): the request
                                                           object handed to the engines as is

A route is one :class:`Route` in :data:`ROUTES`: its path, its request type, how an HTTP answer
decodes into the reply, its timeout and whether a lost call may be sent again. The client
builds the request object and gets the reply object back; only the HTTP transport encodes
and decodes, so the in-process transport adds no serialization and no copy.

Adding a route takes one place per side. Client side: a ``Route`` here, in :data:`ROUTES`;
``EmbeddingClient.call(route, request)`` then sends it over either transport (a named client
method that builds the request from plain arguments is optional). Worker side: its
``Handler`` in ``HANDLERS`` (``pyrsia/services/embedding_worker/handlers.py``), the one table
the embedding worker's HTTP server and the in-process transport both dispatch through (a
route that reaches the PS also needs its method in the worker's ``PSLink``, which the HTTP
PS client and embedded mode's ``LocalPS`` implement). A route without a handler fails the
worker's start and the in-process transport's construction, naming it; a transport that
lacks a route fails when a client is built on it (:func:`check_routes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pyrsia.shared.constants import ADMIN_TIMEOUT_S, LOOKUP_TIMEOUT_S
from pyrsia.shared.errors import MisuseError
from pyrsia.shared.wire import worker as wire
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer

Req = TypeVar("Req")
Rep = TypeVar("Rep")


def _never(_request: Any) -> bool:
    return False


def _always(_request: Any) -> bool:
    return True


def _as_is(answer: Any, _batch_size: int | None) -> Any:
    return answer


@dataclass(frozen=True)
class Route(Generic[Req, Rep]):
    """One route of the embedding worker, as a client calls it."""

    path: str
    """The worker's HTTP path, and the route's name in every transport."""
    request: type[Req]
    """The request's type (a ``pyrsia.shared.wire`` dataclass with ``to_wire``)."""
    decode: Callable[[Any, int | None], Rep]
    """An HTTP answer -> the reply, checked (the call's ``batch_size``: the rows expected)."""
    timeout_s: float
    retry: Callable[[Req], bool] = _never
    """Whether a call lost on the way may be sent again (the request is idempotent)."""


LOOKUP: Route[wire.Lookup, wire.Embeddings] = Route(
    "/lookup", wire.Lookup, wire.Embeddings.from_wire, LOOKUP_TIMEOUT_S
)
LOOKUP_DIRECT: Route[wire.LookupDirect, wire.Embeddings] = Route(
    "/lookup_direct",
    wire.LookupDirect,
    wire.Embeddings.from_wire,
    LOOKUP_TIMEOUT_S,
    retry=lambda request: not request.train,  # a training lookup buffers the batch
)
GRADIENTS: Route[wire.Gradients, wire.GradientsApplied] = Route(
    "/gradients",
    wire.Gradients,
    lambda answer, _: wire.GradientsApplied.from_wire(answer),
    LOOKUP_TIMEOUT_S,
)
CONFIGURE: Route[Configure, Any] = Route("/configure", Configure, _as_is, ADMIN_TIMEOUT_S, _always)
REGISTER_OPTIMIZER: Route[RegisterOptimizer, Any] = Route(
    "/register_optimizer", RegisterOptimizer, _as_is, ADMIN_TIMEOUT_S, _always
)
DUMP: Route[Directory, Any] = Route("/dump", Directory, _as_is, ADMIN_TIMEOUT_S)
LOAD: Route[Directory, Any] = Route("/load", Directory, _as_is, ADMIN_TIMEOUT_S)
CLEAR: Route[Empty, Any] = Route("/clear", Empty, _as_is, ADMIN_TIMEOUT_S, _always)
SCHEMA: Route[Empty, wire.WorkerSchema] = Route(
    "/schema",
    Empty,
    lambda answer, _: wire.WorkerSchema.from_wire(answer),
    ADMIN_TIMEOUT_S,
    _always,
)
STATS: Route[Empty, wire.WorkerStats] = Route(
    "/stats", Empty, lambda answer, _: wire.WorkerStats.from_wire(answer), ADMIN_TIMEOUT_S, _always
)

ROUTES: tuple[Route[Any, Any], ...] = (
    LOOKUP,
    LOOKUP_DIRECT,
    GRADIENTS,
    CONFIGURE,
    REGISTER_OPTIMIZER,
    DUMP,
    LOAD,
    CLEAR,
    SCHEMA,
    STATS,
)
"""Every route an embedding client calls; every transport answers each of them."""


class EmbeddingTransport(Protocol):
    """What an embedding client needs of a way to reach the embedding workers.

    Workers are numbered from 0 (the index a data loader's reference names); the
    administration routes go to worker 0, which forwards them to every PS replica.
    """

    routes: frozenset[str]
    """The paths of the routes this transport answers (every path of :data:`ROUTES`)."""

    @property
    def addresses(self) -> list[str]:
        """The workers' addresses known now (empty before :meth:`connect`)."""
        ...

    async def connect(self) -> list[str]:
        """Wait until the workers are known; their addresses."""
        ...

    async def refresh(self) -> None:
        """Re-read the addresses (a worker restarted elsewhere)."""
        ...

    async def address(self, worker: int) -> str:
        """Worker ``worker``'s address; an ``InvalidInputError`` naming ``worker`` if none."""
        ...

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Return once every worker is ready to answer (None: the transport's own wait)."""
        ...

    async def call(
        self, worker: int, route: Route[Req, Rep], request: Req, batch_size: int | None = None
    ) -> Rep:
        """Send ``request`` on ``route`` to worker ``worker``; its reply. ``batch_size``: the
        rows an embeddings answer must have (a transport that decodes checks them)."""
        ...

    def close(self) -> None:
        """Release what the transport owns (not the process's shared HTTP client)."""
        ...


def check_routes(transport: EmbeddingTransport, routes: Iterable[Route[Any, Any]] = ROUTES) -> None:
    """Raise a ``MisuseError`` naming the routes ``transport`` does not answer."""
    have = getattr(transport, "routes", None)
    if not isinstance(have, frozenset):
        raise MisuseError(
            f"{type(transport).__name__} is not an embedding transport: it has no `routes` "
            "(a frozenset of the route paths it answers; pyrsia.shared.embedding_transport)"
        )
    missing = [route.path for route in routes if route.path not in have]
    if missing:
        raise MisuseError(
            f"{type(transport).__name__} lacks the embedding route(s) {', '.join(missing)}: "
            "every route of pyrsia.shared.embedding_transport.ROUTES needs a handler in every "
            "transport"
        )
