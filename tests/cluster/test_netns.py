"""The harness's own promises: hosts are isolated and named, a cut link cuts, and a run that
crashed leaves nothing the next run does not remove."""

from __future__ import annotations

import os
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
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_RUN], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        sleeper = int(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)  # no finally, no close(): a crash
        proc.wait()
        proc.stdout.close()
    prefix = f"{PREFIX}{proc.pid}"
    assert f"{prefix}-a" in _ip_lines("netns", "list")
    removed = remove_stale()
    assert f"{prefix}-a" in removed and f"{prefix}c" in removed, removed
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
