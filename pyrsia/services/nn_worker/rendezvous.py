"""torch.distributed stores that listen on one address, not on every interface.

torch's ``TCPStore`` server binds the wildcard address (``::``) whatever host it is given:
the host only tells clients where to connect. Two such stores run in an NN-worker job:
torchrun's rendezvous store on ``MASTER_PORT`` (hosted by the launcher's agent on node 0)
and the DDP store rank 0 hosts on ``DDPOption.master_port``. Both would be open to the
network even when every Pyrsia server binds loopback, which breaks the bind rule (README
Security: loopback unless ``PERSIA_AUTH_TOKEN`` or ``--insecure``).

``TCPStore`` takes an already listening socket (``master_listen_fd``), and torchrun takes
rendezvous handlers by name (``rendezvous_handler_registry``, its documented extension
point). So :func:`bound_tcp_store` binds a socket to the host's own address and hands it to
the store, and :data:`BACKEND` is torch's static rendezvous with that one change; the
launcher runs torchrun with ``--rdzv-backend`` set to it.
"""

from __future__ import annotations

import datetime
import logging
import socket

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from pyrsia.shared.auth import is_loopback
from pyrsia.shared.constants import RENDEZVOUS_TIMEOUT_S
from pyrsia.shared.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)

BACKEND = "pyrsia-static"
"""torchrun's ``--rdzv-backend`` for :class:`BoundStaticRendezvous`."""
_LISTEN_BACKLOG = 2048


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``'s address (its first, as clients resolve it)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
    except OSError as exc:
        raise ConfigError(f"torch.distributed store: cannot resolve {host!r}: {exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"torch.distributed store: cannot listen on {address[0]} port {port}: {exc}"
        ) from exc
    return sock


def bound_tcp_store(
    host: str,
    port: int,
    world_size: int,
    is_master: bool,
    timeout: datetime.timedelta,
    *,
    multi_tenant: bool = False,
) -> TCPStore:
    """A ``TCPStore`` at ``host:port``; its server (``is_master``) listens on ``host`` only.

    A loopback ``host`` that cannot be bound is an error. A network ``host`` (allowed by the
    bind rule only with a token or ``--insecure``) that does not resolve or is not one of
    this machine's addresses yet (a pod's DNS name before the pod is ready) falls back to
    torch's own store on every interface, with a warning.
    """
    if not is_master:
        return TCPStore(host, port, world_size, False, timeout, multi_tenant=multi_tenant)
    try:
        sock = listening_socket(host, port)
    except ConfigError as exc:
        if is_loopback(host):
            raise
        log.warning("%s; the store listens on every interface instead", exc)
        return TCPStore(host, port, world_size, True, timeout, multi_tenant=multi_tenant)
    bound_port = sock.getsockname()[1]
    # the store owns the descriptor from here on: detach it so Python never closes it
    return TCPStore(
        host,
        bound_port,
        world_size,
        True,
        timeout,
        multi_tenant=multi_tenant,
        master_listen_fd=sock.detach(),
    )


class BoundStaticRendezvous(StaticTCPRendezvous):
    """torch's static rendezvous whose store (on node 0) listens on ``master_addr`` only."""

    def get_backend(self) -> str:
        return BACKEND

    def next_rendezvous(self) -> RendezvousInfo:
        if not self._store:
            self._store = bound_tcp_store(
                self.master_addr,
                self.master_port,
                self.world_size,
                self.rank == 0,
                self.timeout,
                multi_tenant=True,
            )
        return RendezvousInfo(
            PrefixStore(self.run_id, self._store),
            self.rank,
            self.world_size,
            RendezvousStoreInfo(self.master_addr, self.master_port),
        )


def _create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler for ``--rdzv-backend=pyrsia-static --rdzv-endpoint=host:port
    --rdzv-conf=rank=<node rank>`` (what the launcher passes)."""
    host, port = parse_rendezvous_endpoint(params.endpoint.strip(), -1)
    if port == -1:
        raise InvalidInputError(
            "rendezvous endpoint",
            "host:port",
            message=f"rendezvous endpoint {params.endpoint!r} has no port",
        )
    rank = int(params.config["rank"])
    timeout = int(params.config.get("timeout", RENDEZVOUS_TIMEOUT_S))
    return BoundStaticRendezvous(host, port, rank, params.max_nodes, params.run_id, timeout)


def register_rendezvous() -> None:
    """Make :data:`BACKEND` known to torchrun in this process (idempotent)."""
    rendezvous_handler_registry.register(BACKEND, _create_handler)
