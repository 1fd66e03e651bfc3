"""The links between the cluster benchmark's hosts (``cluster_bench.py``): the delay proxies
in front of every server host, and the probes that measure what a setting gives: a 64-byte
ping-pong through the proxy (RTT median and p90, against an echo server on ``ps0``) and a
bulk TCP transfer (Gbit/s, into a sink on ``ps0``). The probes are small Python programs run
in the namespaces with ``python -c``.
"""

from __future__ import annotations

import subprocess
import sys
import time

from _common import REPO

from tests.cluster.netns import Network

SERVERS = ("redis", "ps0", "ew0", "nn0")
ECHO_PORT = 7007
SINK_PORT = 7008
BULK = (
    "import socket,sys,time\n"
    "c=socket.create_connection((sys.argv[1],int(sys.argv[2])),5);buf=b'x'*(1<<20)\n"
    "t=time.perf_counter()\n"
    "for i in range(int(sys.argv[3])): c.sendall(buf)\n"
    "c.shutdown(socket.SHUT_WR);c.recv(1);print(int(sys.argv[3])*8*(1<<20)/(time.perf_counter()-t)/1e9)\n"
)
SINK = (
    "import socket,sys,threading\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(8)\n"
    "def serve(c):\n"
    " while c.recv(1<<20): pass\n"
    " c.sendall(b'k');c.close()\n"
    "while True: threading.Thread(target=serve,args=(s.accept()[0],),daemon=True).start()\n"
)
PING = (
    "import socket,statistics,sys,time\n"
    "c=socket.create_connection((sys.argv[1],int(sys.argv[2])),5)\n"
    "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
    "ts=[]\n"
    "for i in range(400):\n"
    " t=time.perf_counter();c.sendall(b'x'*64);n=0\n"
    " while n<64: n+=len(c.recv(64))\n"
    " ts.append(time.perf_counter()-t)\n"
    "ts=sorted(ts[20:]);print(statistics.median(ts)*1e3, ts[int(len(ts)*.9)]*1e3)\n"
)
ECHO = (
    "import socket,sys,threading\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(8)\n"
    "def serve(c):\n"
    " c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
    " while (d:=c.recv(65536)): c.sendall(d)\n"
    "while True: threading.Thread(target=serve,args=(s.accept()[0],),daemon=True).start()\n"
)


def start_proxies(net: Network, delay_ms: float) -> list:
    """A delay proxy (``tests/cluster/delay_proxy.py``) on every server host's second
    address, holding each chunk ``delay_ms`` each way."""
    procs = []
    for host in SERVERS:
        h = net.hosts[host]
        procs.append(
            net.popen(
                host,
                [
                    sys.executable,
                    "-m",
                    "tests.cluster.delay_proxy",
                    "--listen",
                    h.extra_addresses[0],
                    "--to",
                    h.address,
                    "--delay-ms",
                    str(delay_ms),
                    "--max-seconds",
                    "900",
                ],
                cwd=REPO,
                stdout=-3,
                stderr=-3,
            )
        )
    return procs


def stop(procs: list) -> None:
    """Terminate ``procs`` and reap them."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=10)


def measure_rtt(net: Network, via_proxy: bool) -> tuple[float, float]:
    """Median and p90 RTT (ms) of a 64-byte ping-pong dl0 -> ps0, as the job's hops see it."""
    target = "ps0-0" if via_proxy else "ps0"
    for _ in range(50):
        run = net.run("dl0", [sys.executable, "-c", PING, target, str(ECHO_PORT)])
        if run.returncode == 0:
            p50, p90 = (float(x) for x in run.stdout.split())
            return p50, p90
        time.sleep(0.1)
    raise RuntimeError(f"no RTT through {target}: {run.stderr[-500:]}")


def measure_gbits(net: Network, megabytes: int = 512) -> float:
    """Bulk TCP throughput dl0 -> ps0 (direct, no proxy), Gbit/s."""
    run = net.run(
        "dl0", [sys.executable, "-c", BULK, "ps0", str(SINK_PORT), str(megabytes)], timeout=120
    )
    if run.returncode != 0:
        raise RuntimeError(f"bulk transfer failed: {run.stderr[-500:]}")
    return float(run.stdout)


def calibrate(net: Network, rtt_ms: float) -> tuple[float, float, float]:
    """The one-way delay giving ``rtt_ms`` through the proxy (one correction of the proxy's
    own cost); returns (delay, measured p50, p90)."""
    delay = rtt_ms / 2
    for _ in range(2):
        proxies = start_proxies(net, delay)
        try:
            p50, p90 = measure_rtt(net, True)
        finally:
            stop(proxies)
        if rtt_ms == 0 or abs(p50 - rtt_ms) < 0.1 * rtt_ms + 0.05:
            break
        delay = max(0.0, delay + (rtt_ms - p50) / 2)
    return delay, p50, p90


def start_probe_servers(net: Network) -> list[subprocess.Popen]:
    """The echo server (for the RTT probe) and the sink (for the bulk probe) on ``ps0``."""
    address = net.hosts["ps0"].address
    return [
        net.popen(
            "ps0", [sys.executable, "-c", ECHO, address, str(ECHO_PORT)], stdout=-3, stderr=-3
        ),
        net.popen(
            "ps0", [sys.executable, "-c", SINK, address, str(SINK_PORT)], stdout=-3, stderr=-3
        ),
    ]
