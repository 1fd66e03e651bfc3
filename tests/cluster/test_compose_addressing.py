"""docker-compose.yml's addressing, checked against the multi-host rules.

Rendered as compose renders it (``tests/cluster/compose.py``, with ``.docker.env``), every
server service must: pass the bind rule with its own environment; advertise a name compose's
DNS resolves for the other containers (a service name or alias: not a bare ``hostname``,
and not the container id a wildcard bind would fall back to); and the replica flags must
match the ``*_REPLICAS`` counts. Then, on simulated hosts named as compose names them, each
server's address is bound as its environment says and every Pyrsia service reaches every
advertised address (through aiohttp, the services' own client, so names with underscores
are exercised as the services would use them) and Redis at ``PERSIA_REDIS_URL``.
"""

from __future__ import annotations

import json
import sys

import pytest

from pyrsia.shared.auth import check_bind
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.redis_local import find_redis_server
from tests.cluster.compose import Service, read_env_file, render
from tests.cluster.job import REPO

pytestmark = pytest.mark.timeout(120)

COMPOSE = REPO / "docker-compose.yml"
ENV_FILE = REPO / ".docker.env"
INGRESS_PORT = 9000  # the ranks' ingress binds port 0 (any); the address is what matters
REPLICA_COUNTS = {
    "embedding-parameter-server": "PS_REPLICAS",
    "embedding-worker": "EMBEDDING_WORKER_REPLICAS",
    "data-loader": "DATA_LOADER_REPLICAS",
}
HTTP_LISTENER = (
    "import socket,sys,threading\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(16)\n"
    "def serve(c):\n"
    " c.recv(65536);c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 0\\r\\n"
    "Connection: close\\r\\n\\r\\n');c.close()\n"
    "while True: threading.Thread(target=serve,args=(s.accept()[0],),daemon=True).start()\n"
)
PROBE = (
    "import asyncio,json,sys,aiohttp,redis\n"
    "async def main(urls):\n"
    " out={}\n"
    " async with aiohttp.ClientSession() as s:\n"
    "  for u in urls:\n"
    "   try:\n"
    "    async with s.get(u,timeout=aiohttp.ClientTimeout(total=3)) as r: out[u]=r.status\n"
    "   except Exception as e: out[u]=repr(e)\n"
    " return out\n"
    "out=asyncio.run(main(json.loads(sys.argv[2])))\n"
    "try: out[sys.argv[1]]=redis.Redis.from_url(sys.argv[1],socket_timeout=3).ping()\n"
    "except Exception as e: out[sys.argv[1]]=repr(e)\n"
    "print(json.dumps(out))\n"
)


def bind_host(svc: Service) -> str:
    return svc.environment.get("PERSIA_BIND_HOST") or "127.0.0.1"


def advertised(svc: Service) -> str:
    """What the service registers (pyrsia.shared.service_runner.advertise_host, with the container's
    hostname for a wildcard bind)."""
    explicit = svc.environment.get("PERSIA_ADVERTISE_HOST")
    if explicit:
        return explicit
    bind = bind_host(svc)
    return svc.hostname if bind in ("0.0.0.0", "::", "") else bind


def port(svc: Service) -> int:
    if svc.launcher_command == "nn-worker":
        return INGRESS_PORT
    return int(svc.flag("--port"))


@pytest.fixture(scope="module")
def services() -> dict[str, Service]:
    return render(COMPOSE, ENV_FILE)


def test_compose_services_follow_the_multi_host_rules(services):
    variables = read_env_file(ENV_FILE)
    dns = set().union(*(s.dns_names for s in services.values()))
    servers = [s for s in services.values() if s.is_server]
    assert {s.launcher_command for s in servers} == {
        "embedding-parameter-server",
        "embedding-worker",
        "nn-worker",
    }
    for svc in servers:
        env = svc.environment
        try:
            check_bind(
                bind_host(svc),
                token=env.get("PERSIA_AUTH_TOKEN") or None,
                insecure=env.get("PERSIA_INSECURE") in ("1", "true", "yes", "on"),
            )
        except ConfigError as exc:
            pytest.fail(f"{svc.name}: {exc}")
        assert advertised(svc) in dns, (
            f"{svc.name} advertises {advertised(svc)!r}, which compose's DNS does not resolve "
            f"for the other containers (names: {sorted(dns)})"
        )
    for svc in services.values():
        url = svc.environment.get("PERSIA_REDIS_URL")
        if svc.is_pyrsia:
            assert url, f"{svc.name}: no PERSIA_REDIS_URL"
            host = url.split("://", 1)[1].split("/")[0].rsplit("@", 1)[-1].rsplit(":", 1)[0]
            assert host in dns, f"{svc.name}: PERSIA_REDIS_URL host {host!r} is not a service"
    for command, count_var in REPLICA_COUNTS.items():
        mine = [s for s in services.values() if s.launcher_command == command]
        count = int(variables[count_var])
        indices = sorted(int(s.flag("--replica-index")) for s in mine)
        assert indices == list(range(count)), (command, indices, count_var, count)
        assert {s.flag("--replica-size") for s in mine} == {str(count)}, command


def test_compose_addresses_are_reachable_from_every_host(services, network, tmp_path):
    """Every service on a host of its own named as compose names it; every advertised
    address and the Redis URL reached from every Pyrsia service's host."""
    net = network(sorted(services))
    redis_cmd = services["redis"].command
    # the official redis image builds with protected mode off (docker-library/redis)
    net.popen(
        "redis",
        [find_redis_server(), *redis_cmd[1:], "--protected-mode", "no"],
        stdout=-3,
        stderr=-3,
    )
    urls = []
    for svc in services.values():
        if svc.is_server:
            net.popen(
                svc.name,
                [sys.executable, "-c", HTTP_LISTENER, bind_host(svc), str(port(svc))],
                stdout=-3,
                stderr=-3,
            )
            urls.append(f"http://{advertised(svc)}:{port(svc)}/health")
    failures = {}
    for svc in services.values():
        if not svc.is_pyrsia:
            continue
        found = {}
        for _ in range(40):  # the listeners start in parallel: retry briefly
            run = net.run(
                svc.name,
                [
                    sys.executable,
                    "-c",
                    PROBE,
                    svc.environment["PERSIA_REDIS_URL"],
                    json.dumps(urls),
                ],
            )
            found = json.loads(run.stdout) if run.returncode == 0 else {"probe": run.stderr}
            if all(v in (200, True) for v in found.values()):
                break
        bad = {k: v for k, v in found.items() if v not in (200, True)}
        if bad:
            failures[svc.name] = bad
    assert not failures, failures
