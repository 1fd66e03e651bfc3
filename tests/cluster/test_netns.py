"""The harness's own promises: hosts are isolated and named, a cut link cuts, and a run that
crashed leaves nothing the next run does not remove."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.job import REPO
from tests.cluster.netns import NETNS_ETC, PREFIX, remove_stale

pytestmark = pytest.mark.timeout(60)

CRASHING_RUN = (
    "import sys, time\n"
    "from tests.cluster.netns import Network\n"
    "net = Network(['a', 'b']).create()\n"
    "sleeper = net.popen('a', ['sleep', '300'])\n"
    "print(sleeper.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def _ip_lines(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True).stdout


def test_hosts_are_named_reach_each_other_and_a_cut_link_cuts(network):
    net = network(["a", "b"])
    assert net.run("a", ["cat", "/proc/sys/kernel/hostname"]).stdout.strip() == "a"
    assert net.hosts["b"].address in net.run("a", ["getent", "hosts", "b"]).stdout
    ping = ["ping", "-c", "1", "-W", "1", "b"]
    assert net.run("a", ping).returncode == 0
    net.cut("b")
    assert net.run("a", ping).returncode != 0
    net.restore("b")
    assert net.run("a", ping).returncode == 0


def test_a_crashed_runs_namespaces_links_and_processes_are_removed(netns_reason):
    if netns_reason is not None:
        pytest.skip(f"cluster in a box needs network namespaces: {netns_reason}")
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUN],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        sleeper = int(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)  # no finally, no close(): a crash
        proc.wait()
        proc.stdout.close()
    prefix = f"{PREFIX}{proc.pid}"
    assert f"{prefix}-a" in _ip_lines("netns", "list")
    remove_stale()  # (a concurrent run's own remove_stale may have taken some of them first)
    deadline = time.monotonic() + 5
    while prefix in _ip_lines("netns", "list") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert prefix not in _ip_lines("netns", "list")
    assert prefix not in _ip_lines("link", "show")
    assert not any(p.name.startswith(prefix) for p in NETNS_ETC.iterdir())
    # the process left running in a host was stopped (gone, or a zombie not yet reaped)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(sleeper):
        time.sleep(0.1)
    assert not _running(sleeper)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


ONE_WAY_MS = 2.0


def _ping_min_ms(net, src: str, dst: str) -> float:
    out = net.run(src, ["ping", "-c", "5", "-i", "0.2", "-W", "2", dst]).stdout
    return float(re.search(r"= ([\d.]+)/", out)[1])


def _allreduce(net, master: str, peer: str) -> dict:
    probe = str(Path(__file__).with_name("gloo_probe.py"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1"}
    other = net.popen(
        peer,
        [sys.executable, probe, master, "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        rank0 = net.run(master, [sys.executable, probe, master, "0"], env=env, timeout=90)
        other.wait(timeout=30)
    finally:
        other.kill()
        other.wait()
        other_err = other.stderr.read().decode(errors="replace")
        other.stderr.close()
    assert rank0.returncode == 0 and other.returncode == 0, (
        rank0.stderr[-1500:],
        other_err[-1500:],
    )
    return json.loads(rank0.stdout.strip().splitlines()[-1])


def test_a_delayed_link_delays_every_packet_gloo_all_reduce_included(network):
    """``Network.delay`` holds every packet of a host's link (tap_delay): ICMP, and gloo's
    connections between two ranks, whose addresses no TCP relay could know in advance.
    An all-reduce between two ranks takes at least one round trip: with 2 ms each way on
    c's link, a -> c's all-reduce must take 4 ms or more; a -> b (no delay) is shown beside."""
    net = network(["a", "b", "c"])
    net.delay("c", ONE_WAY_MS)
    ping_c, ping_b = _ping_min_ms(net, "a", "c"), _ping_min_ms(net, "a", "b")
    assert ping_c >= 2 * ONE_WAY_MS, ping_c
    assert ping_b < 2 * ONE_WAY_MS, ping_b  # the others' links are untouched
    direct = _allreduce(net, "a", "b")
    delayed = _allreduce(net, "a", "c")
    print(
        f"\nping min ms: a-b {ping_b}, a-c {ping_c}; gloo all-reduce of 4096 floats, "
        f"p50/p90 ms: a-b {direct['p50_ms']}/{direct['p90_ms']}, "
        f"a-c ({ONE_WAY_MS:g} ms each way) {delayed['p50_ms']}/{delayed['p90_ms']}"
    )
    assert delayed["p50_ms"] >= 2 * ONE_WAY_MS, (direct, delayed)
    # the cable of a delayed host can still be pulled
    net.cut("c")
    assert net.run("a", ["ping", "-c", "1", "-W", "1", "c"]).returncode != 0
    net.restore("c")
    assert _ping_min_ms(net, "a", "c") >= 2 * ONE_WAY_MS
