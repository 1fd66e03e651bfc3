"""Simulated hosts on one machine: Linux network namespaces on a private bridge.

One :class:`Network` per run; ``<p>`` is ``pyc<pid>`` (the pid of the test process that
made it), so a crashed run's leftovers never collide with a live run and
:func:`remove_stale` can tell them apart (their pid is dead)::

    root namespace                <p>-sw (the switch)             <p>-<host>  (one per host)
    ------------------------      -------------------------       ------------------------------
    <p>c 10.231.N.254/24  --veth--  c --+                          lo 127.0.0.1
                                        br0 --- v<i> --veth-------  eth0 10.231.N.(10+i)/24
                                        +------ v<j> --veth-------  eth0 10.231.N.(10+j)/24

Every host namespace sees an ``/etc/hosts`` naming every host (``ip netns exec`` mounts
``/etc/netns/<ns>/hosts`` over it), so its processes dial peers by name as they would
through compose's DNS or a Kubernetes headless Service; :meth:`Network.popen` runs a
command in a host under ``unshare --uts`` with the host's name as its hostname. The root
namespace's ``<p>c`` link lets the test process itself reach every host (Redis, /metrics).

Links: :meth:`Network.cut` takes a host's switch port down (its cable pulled: nothing
crosses in either direction, open TCP connections stay open and retransmit) and
:meth:`Network.restore` brings it back; :meth:`Network.shape` caps a host's link with a
token bucket (``tc tbf``) on both ends of its veth. ``sch_netem`` is not assumed: latency
comes from :mod:`tests.cluster.delay_proxy` (the TCP ports a service advertises) or from
:meth:`Network.delay`, which puts :mod:`tests.cluster.tap_delay` in a host's link so that
every packet to and from the host waits (gloo's connections between NN-worker ranks too).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.tap import ip as _ip
from tests.cluster.tap import start_tap_relay, use_tap, wait_for_carrier

PREFIX = "pyc"
SUBNET_FIRST_OCTETS = "10.231"
NETNS_ETC = Path("/etc/netns")
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
_ROOT_LINK = re.compile(rf"^{PREFIX}(\d+)c$")


class NetnsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, no ``ip``, no CAP_NET_ADMIN)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (a skip reason), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    for tool, package in (
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("unshare", "util-linux"),
        ("ping", "iputils-ping"),
    ):
        if shutil.which(tool) is None:
            return f"no `{tool}` on PATH (apt-get install {package})"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        link = _ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if link.returncode != 0:
            return f"no bridge in a namespace: {link.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def namespace_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def _kill_namespace_processes(ns: str, grace_s: float = 3.0) -> None:
    """SIGTERM every process in ``ns``, then SIGKILL what is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        pids = namespace_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while namespace_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.05)


def remove_stale() -> list[str]:
    """Delete the namespaces, root links and hosts files of runs whose process is dead."""
    removed = []
    names = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines()]
    for ns in names:
        m = _NAME.match(ns)
        if m and not _pid_alive(int(m[1])):
            _kill_namespace_processes(ns, grace_s=0.5)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        m = _ROOT_LINK.match(name)
        if m and not _pid_alive(int(m[1])):
            _ip("link", "del", name, check=False)
            removed.append(name)
    if NETNS_ETC.is_dir():
        for entry in NETNS_ETC.iterdir():
            m = _NAME.match(entry.name)
            if m and not _pid_alive(int(m[1])):
                shutil.rmtree(entry, ignore_errors=True)
    return removed


@dataclass
class Host:
    name: str
    address: str
    ns: str
    port: str  # the switch-side veth, in the switch namespace
    cut: bool = False
    tap: bool = False  # its link runs through tap_delay (see Network.delay)
    extra_addresses: list[str] = field(default_factory=list)


class Network:
    """A bridge in its own namespace and one namespace per host; :meth:`close` undoes all."""

    def __init__(
        self, hosts: list[str], *, octet: int | None = None, loopback_hostname: bool = False
    ):
        """``loopback_hostname``: each host resolves its own name to 127.0.1.1, as Debian's
        and Ubuntu's installers write ``/etc/hosts`` (the others still resolve it to its
        address)."""
        self.prefix = f"{PREFIX}{os.getpid()}"
        self.octet = octet if octet is not None else 1 + os.getpid() % 250
        self.subnet = f"{SUBNET_FIRST_OCTETS}.{self.octet}"
        self.switch = f"{self.prefix}-sw"
        self.root_link = f"{self.prefix}c"
        self.control_address = f"{self.subnet}.254"
        self.hosts: dict[str, Host] = {}
        self._names = list(hosts)
        self._procs: list[subprocess.Popen] = []
        self._relays: dict[str, subprocess.Popen] = {}
        self._relay_errors: list = []  # the relays' stderr files
        self.loopback_hostname = loopback_hostname

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> Network:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self) -> Network:
        remove_stale()
        _ip("netns", "add", self.switch)
        sw = ("-n", self.switch)
        _ip(*sw, "link", "add", "br0", "type", "bridge")
        _ip(*sw, "link", "set", "br0", "up")
        _ip(
            "link", "add", self.root_link, "type", "veth", "peer", "name", "c", "netns", self.switch
        )
        _ip(*sw, "link", "set", "c", "master", "br0", "up")
        _ip("addr", "add", f"{self.control_address}/24", "dev", self.root_link)
        _ip("link", "set", self.root_link, "up")
        for i, name in enumerate(self._names):
            self._add_host(i, name)
        for host in self.hosts.values():
            etc = NETNS_ETC / host.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(self.hosts_file(host.name))
        return self

    def _add_host(self, i: int, name: str) -> None:
        ns = f"{self.prefix}-{name}"
        host = Host(name=name, address=f"{self.subnet}.{10 + i}", ns=ns, port=f"v{i}")
        self.hosts[name] = host
        _ip("netns", "add", ns)
        _ip(
            "-n",
            self.switch,
            "link",
            "add",
            host.port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns,
        )
        _ip("-n", self.switch, "link", "set", host.port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def hosts_file(self, own: str) -> str:
        lines = ["127.0.0.1 localhost", f"{self.control_address} control"]
        if self.loopback_hostname:
            lines.append(f"127.0.1.1 {own}")
        for host in self.hosts.values():
            if host.name != own or not self.loopback_hostname:
                lines.append(f"{host.address} {host.name}")
            lines.extend(f"{extra} {host.name}-{k}" for k, extra in enumerate(host.extra_addresses))
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        """Stop every process in the hosts, delete every namespace, link and hosts file.

        Safe to call twice and after a partial :meth:`create`."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for host in self.hosts.values():
            _kill_namespace_processes(host.ns)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for host in self.hosts.values():
            _ip("netns", "del", host.ns, check=False)
            shutil.rmtree(NETNS_ETC / host.ns, ignore_errors=True)
        _ip("link", "del", self.root_link, check=False)
        _ip("netns", "del", self.switch, check=False)
        for errors in self._relay_errors:
            errors.close()
        self._relay_errors.clear()

    # --- processes ----------------------------------------------------------------------
    def command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host``: its network namespace, its hostname."""
        h = self.hosts[host]
        return [
            "ip",
            "netns",
            "exec",
            h.ns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"',
            h.name,
            *argv,
        ]
        # not hostname(1): it refuses compose's service names (underscores)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``host``, in a session of its own (killed by :meth:`close`)."""
        proc = subprocess.Popen(self.command(host, argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], timeout: float = 30, **kwargs):
        return subprocess.run(
            self.command(host, argv), timeout=timeout, capture_output=True, text=True, **kwargs
        )

    # --- links --------------------------------------------------------------------------
    def cut(self, host: str) -> None:
        """Pull ``host``'s cable: its switch port goes down."""
        _ip("-n", self.switch, "link", "set", self.hosts[host].port, "down")
        self.hosts[host].cut = True

    def restore(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[host].port, "up")
        self.hosts[host].cut = False

    def shape(self, host: str, rate: str) -> None:
        """Cap ``host``'s link at ``rate`` (tc syntax: ``1gbit``) in both directions."""
        bits = _rate_bits(rate)
        burst = max(256 * 1024, bits // 8 // 250)  # one 4 ms tick at HZ=250, at least 256 KiB
        h = self.hosts[host]
        for where in (("-n", self.switch, h.port), ("-n", h.ns, "eth0")):
            ns_flag, ns, dev = where
            subprocess.run(
                [
                    "tc",
                    ns_flag,
                    ns,
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    str(burst),
                    "latency",
                    "50ms",
                ],
                check=True,
                capture_output=True,
                text=True,
            )
        # veth segments up to 64 KiB (GSO): a bucket smaller than a segment would drop it

    def unshape(self, host: str) -> None:
        h = self.hosts[host]
        for ns_flag, ns, dev in (("-n", self.switch, h.port), ("-n", h.ns, "eth0")):
            subprocess.run(
                ["tc", ns_flag, ns, "qdisc", "del", "dev", dev, "root"], capture_output=True
            )

    def delay(self, host: str, one_way_ms: float, timeout_s: float = 10.0) -> None:
        """Hold every packet to and from ``host`` ``one_way_ms`` on its link, each way.

        A round trip between ``host`` and any other host gains ``2 * one_way_ms``, for every
        protocol and port (gloo's pairs between NN-worker ranks included), where
        :mod:`tests.cluster.delay_proxy` delays only the TCP ports a service listens on.
        The first call replaces the host's veth pair with two TAP devices relayed by
        :mod:`tests.cluster.tap_delay` (call it before the host's processes start: a
        :meth:`shape` made earlier is lost, and peers' ARP caches are flushed); a later call
        restarts the relay with the new delay (frames in flight are lost, TCP resends them).
        """
        if not one_way_ms >= 0:
            raise ValueError(f"one_way_ms: expected milliseconds >= 0, got {one_way_ms!r}")
        h = self.hosts[host]
        relay = self._relays.pop(host, None)
        if relay is not None:
            relay.terminate()
            relay.wait(timeout=5)
        if not h.tap:
            others = [other.ns for other in self.hosts.values()]
            use_tap(self.switch, h.ns, h.port, [h.address, *h.extra_addresses], h.cut, others)
            h.tap = True
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - the relay's stderr, read on failure
        self._relay_errors.append(errors)
        relay = start_tap_relay(self.switch, h.ns, h.port, one_way_ms, errors)
        self._procs.append(relay)
        self._relays[host] = relay
        wait_for_carrier(h.ns, relay, errors, timeout_s, host)

    def add_address(self, host: str) -> str:
        """A second address on ``host``'s link (``<host>-<k>`` in every hosts file)."""
        h = self.hosts[host]
        index = list(self.hosts).index(host)
        address = f"{self.subnet}.{100 + index * 4 + len(h.extra_addresses)}"
        _ip("-n", h.ns, "addr", "add", f"{address}/24", "dev", "eth0")
        h.extra_addresses.append(address)
        for other in self.hosts.values():
            (NETNS_ETC / other.ns / "hosts").write_text(self.hosts_file(other.name))
        return address

    def address_of(self, name_or_address: str) -> str:
        """An address the root namespace can dial for a host name (or an address)."""
        if name_or_address in self.hosts:
            return self.hosts[name_or_address].address
        for host in self.hosts.values():
            for k, extra in enumerate(host.extra_addresses):
                if name_or_address == f"{host.name}-{k}":
                    return extra
        return name_or_address


def _rate_bits(rate: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate: expected e.g. 1gbit or 100mbit, got {rate!r}")
    return int(float(m[1]) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m[2]])
