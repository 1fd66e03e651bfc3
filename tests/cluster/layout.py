"""Where the cluster job's processes go and what each runs: the :class:`Layout` (how many
of each process, one host each), the ports every server listens on, and
:func:`host_argv`, the command line of the process on one host.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrsia.shared.redis_local import find_redis_server

REDIS_PORT = 6379
PS_PORT = 8888
EW_PORT = 8887
MASTER_PORT = 29500


@dataclass(frozen=True)
class Layout:
    """How many of each process; each gets a host of its own."""

    ps: int = 2
    ew: int = 2
    dl: int = 2
    nn: int = 2

    def hosts(self) -> list[str]:
        return (
            ["redis"]
            + [f"ps{i}" for i in range(self.ps)]
            + [f"ew{i}" for i in range(self.ew)]
            + [f"nn{r}" for r in range(self.nn)]
            + [f"dl{i}" for i in range(self.dl)]
        )


FULL = Layout()
"""The issue's layout: Redis, 2 PS, 2 embedding workers, 2 data loaders, 2 NN-worker nodes."""


def host_argv(layout: Layout, host: str, address: str, resume: bool) -> list[str]:
    """The command line of ``host``'s process (``address``: the host's, which Redis binds;
    ``resume``: the NN-worker nodes and data loaders go on from the last checkpoint)."""
    index, then = host[2:], (["--resume"] if resume else [])
    if host == "redis":
        return [
            find_redis_server(),
            "--port",
            str(REDIS_PORT),
            "--bind",
            address,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ]
    if host.startswith("ps"):
        return _server_argv("embedding-parameter-server", index, layout.ps, PS_PORT)
    if host.startswith("ew"):
        return _server_argv("embedding-worker", index, layout.ew, EW_PORT)
    if host.startswith("nn"):
        return [
            "persia-launcher",
            "nn-worker",
            "--nproc-per-node",
            "1",
            "--nnodes",
            str(layout.nn),
            "--node-rank",
            index,
            "--master-addr",
            "nn0",
            "--master-port",
            str(MASTER_PORT),
            *then,
        ]
    if host.startswith("dl"):
        return [
            "persia-launcher",
            "data-loader",
            "--replica-index",
            index,
            "--replica-size",
            str(layout.dl),
            *then,
        ]
    raise ValueError(host)


def _server_argv(subcommand: str, index: str, replicas: int, port: int) -> list[str]:
    """A PS or embedding-worker replica on its fixed port."""
    return [
        "persia-launcher",
        subcommand,
        "--replica-index",
        index,
        "--replica-size",
        str(replicas),
        "--port",
        str(port),
    ]
