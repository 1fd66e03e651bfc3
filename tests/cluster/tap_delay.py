"""A delaying link for every packet of a host: two TAP devices and a relay between them.

``sch_netem`` is missing here (so are ``fq``'s departure times and iptables), and
:mod:`tests.cluster.delay_proxy` only delays the TCP ports it relays: connections whose
peer address is exchanged at run time (gloo's pairs between NN-worker ranks, which learn
each other's listening address through the rendezvous store) bypass it. This module
delays at the link instead, below TCP, for every packet of every protocol:

    host namespace            this process (root namespace)            switch namespace
    eth0 (tap) <--- frames ---> hold each frame D ms, in order <---> v<i> (tap) -- br0

A host's veth pair is replaced by two persistent TAP devices (:meth:`Network.delay
<tests.cluster.netns.Network.delay>`): ``eth0`` in the host, ``v<i>`` on the bridge. This
process opens both (entering each namespace with ``setns`` to do so), then relays
frames each way, each one sent ``D`` ms after it was read: a round trip between the host
and any other gains ``2 D``. Threads, not asyncio (an event loop's timers round to the
millisecond); order is kept per direction. A direction holds at most ``MAX_QUEUED`` frames
and drops beyond that, as a router's queue does. While this process is down the TAP
devices have no carrier: the host's cable is pulled. It exits when ``--parent-pid`` dies,
so a crashed test run leaves no relay behind.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import fcntl
import os
import signal
import struct
import sys
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"
FRAME_MAX = 65536
MAX_QUEUED = 8192
SWITCH_INTERVAL_S = 0.0001


def enter_netns(ns: str) -> None:
    """Move this (still single-threaded) process into network namespace ``ns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"{NETNS_DIR}/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tap(name: str) -> int:
    """A file descriptor on the existing TAP device ``name`` of the current namespace."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Direction:
    """One way: a reader thread stamps and queues frames, a sender writes each when due."""

    def __init__(self, src: int, dst: int, delay_s: float):
        self.src, self.dst, self.delay_s = src, dst, delay_s
        self.queue: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.dropped = 0

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._send, daemon=True).start()

    def _read(self) -> None:
        while True:
            frame = os.read(self.src, FRAME_MAX)
            due = time.monotonic() + self.delay_s
            with self.cond:
                if len(self.queue) >= MAX_QUEUED:
                    self.dropped += 1
                    continue
                self.queue.append((due, frame))
                if len(self.queue) == 1:
                    self.cond.notify()

    def _send(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                due, frame = self.queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                os.write(self.dst, frame)
            except OSError:  # the other end has no carrier yet (link down): the frame is lost
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host-ns", required=True, help="the host's namespace")
    parser.add_argument("--host-tap", default="eth0", help="the host's TAP device")
    parser.add_argument("--switch-ns", required=True, help="the switch's namespace")
    parser.add_argument("--switch-tap", required=True, help="the bridge port's TAP device")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    parser.add_argument("--parent-pid", type=int, required=True, help="exit when it dies")
    args = parser.parse_args(argv)
    if not args.delay_ms >= 0:
        parser.error(f"--delay-ms: expected milliseconds >= 0, got {args.delay_ms}")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    enter_netns(args.host_ns)
    host_fd = open_tap(args.host_tap)
    enter_netns(args.switch_ns)
    switch_fd = open_tap(args.switch_tap)
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # a due frame must not wait 5 ms for the GIL
    delay_s = args.delay_ms / 1000.0
    for way in (Direction(host_fd, switch_fd, delay_s), Direction(switch_fd, host_fd, delay_s)):
        way.start()
    print(
        f"tap delay {args.host_ns}/{args.host_tap} <-> {args.switch_tap}: "
        f"{args.delay_ms} ms each way",
        flush=True,
    )
    while True:
        time.sleep(1.0)
        try:
            os.kill(args.parent_pid, 0)
        except ProcessLookupError:
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
