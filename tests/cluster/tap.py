"""A host's link through :mod:`tests.cluster.tap_delay`, for :meth:`Network.delay
<tests.cluster.netns.Network.delay>`: the host's veth pair replaced by two TAP devices
(``eth0`` in the host, its switch port on the bridge) and the relay between them that holds
every frame; plus :func:`ip`, the ``ip`` command every part of the cluster uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

TAP_DELAY = Path(__file__).with_name("tap_delay.py")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip *args``, its output captured (raises on failure when ``check``)."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def use_tap(
    switch: str, ns: str, port: str, addresses: list[str], cut: bool, all_ns: list[str]
) -> None:
    """Replace the veth pair of the host in ``ns`` (switch side ``port``) with two TAPs, its
    ``addresses`` back on ``eth0``, its port down when ``cut``; every namespace of
    ``all_ns`` forgets its neighbours (their ARP caches named the old link)."""
    sw = ("-n", switch)
    ip(*sw, "link", "del", port)  # the veth pair: eth0 in the host goes with it
    ip("-n", ns, "tuntap", "add", "dev", "eth0", "mode", "tap")
    ip(*sw, "tuntap", "add", "dev", port, "mode", "tap")
    ip(*sw, "link", "set", port, "master", "br0")
    ip(*sw, "link", "set", port, "down" if cut else "up")
    for address in addresses:
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")
    for other in all_ns:
        ip("-n", other, "neigh", "flush", "all", check=False)


def start_tap_relay(
    switch: str, ns: str, port: str, one_way_ms: float, errors: IO[bytes]
) -> subprocess.Popen:
    """The relay between the host's TAP and its switch port, holding each frame
    ``one_way_ms``; it dies with this process (``--parent-pid``), its stderr in ``errors``."""
    return subprocess.Popen(
        [
            sys.executable,
            str(TAP_DELAY),
            "--host-ns",
            ns,
            "--switch-ns",
            switch,
            "--switch-tap",
            port,
            "--delay-ms",
            str(one_way_ms),
            "--parent-pid",
            str(os.getpid()),
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )


def wait_for_carrier(
    ns: str, relay: subprocess.Popen, errors: IO[bytes], timeout_s: float, host: str
) -> None:
    """Until the relay has opened the host's TAP (``eth0`` has a carrier); a relay that
    exits or takes longer than ``timeout_s`` is killed and raises with its last stderr."""
    deadline = time.monotonic() + timeout_s
    while "NO-CARRIER" in ip("-n", ns, "link", "show", "eth0").stdout:
        if relay.poll() is not None or time.monotonic() > deadline:
            relay.kill()
            relay.wait()
            errors.seek(0)
            raise RuntimeError(
                f"tap_delay for {host} did not start: "
                f"{errors.read().decode(errors='replace')[-500:]}"
            )
        time.sleep(0.02)
