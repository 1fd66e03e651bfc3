"""A delaying TCP proxy: the latency a wire would add, where ``sch_netem`` is missing.

Run inside a host's namespace: ``python -m tests.cluster.delay_proxy --listen A --to B
--delay-ms D``. It *mirrors* the host: every TCP port listening on address ``B`` (read from
``/proc/net/tcp`` every 20 ms, so a port picked at run time, the NN-worker ingress', is
found too) gets a listener on the same port of address ``A``; each connection to ``A:p``
is relayed to ``B:p`` with every chunk held ``D`` ms in each direction (so a round trip
gains ``2 D``). The services bind ``B`` and advertise ``A`` (the host's second name), so
every request another host makes crosses the delay; traffic inside the host does not.

Threads, not asyncio: an event loop's timers round to the millisecond (epoll), which
would turn a 0.25 ms delay into 1 ms; ``time.sleep`` holds to a few tens of microseconds.
Order is kept per direction (one queue, one sender). Bounded: a direction holds at most
``MAX_QUEUED`` chunks, beyond which its reader waits (TCP back-pressure reaches the sender).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import signal
import socket
import sys
import threading
import time

CHUNK = 256 * 1024
MAX_QUEUED = 256
SCAN_S = 0.02
SWITCH_INTERVAL_S = 0.0001


def listening_ports(address: str) -> set[int]:
    """TCP ports in LISTEN on ``address`` in this namespace (``/proc/net/tcp``)."""
    want = socket.inet_aton(address)[::-1].hex().upper()  # little-endian hex, as the kernel
    ports = set()
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            local, state = fields[1], fields[3]
            host, port = local.split(":")
            if state == "0A" and host == want:
                ports.add(int(port, 16))
    return ports


class Direction:
    """One way of one connection: a reader thread queues chunks, a sender sends them late."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay_s: float):
        self.src, self.dst, self.delay_s = src, dst, delay_s
        self.queue: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._send, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(CHUNK)
                due = time.monotonic() + self.delay_s
                with self.cond:
                    while len(self.queue) >= MAX_QUEUED:
                        self.cond.wait(0.1)
                    self.queue.append((due, data))
                    self.cond.notify_all()
                if not data:
                    return
        except OSError:
            with self.cond:
                self.queue.append((0.0, b""))
                self.cond.notify_all()

    def _send(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.queue:
                        self.cond.wait()
                    due, data = self.queue.popleft()
                    self.cond.notify_all()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError):
                        self.dst.shutdown(socket.SHUT_WR)
                    return
                self.dst.sendall(data)
        except OSError:
            pass
        finally:
            self.done.set()


def relay(client: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    try:
        upstream = socket.create_connection(target, timeout=5)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ways = [Direction(client, upstream, delay_s), Direction(upstream, client, delay_s)]
    for way in ways:
        way.start()

    def close_when_done() -> None:
        for way in ways:
            way.done.wait()
        client.close()
        upstream.close()

    threading.Thread(target=close_when_done, daemon=True).start()


def serve_port(listen: str, to: str, port: int, delay_s: float) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((listen, port))
    server.listen(512)
    while True:
        client, _ = server.accept()
        relay(client, (to, port), delay_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="the address to accept on (advertised)")
    parser.add_argument("--to", required=True, help="the address the services bind")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="exit after this long")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    # a thread whose chunk is due must not wait Python's default 5 ms for the GIL
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    delay_s = args.delay_ms / 1000.0
    served: set[int] = set()
    deadline = time.monotonic() + args.max_seconds
    print(f"delay proxy {args.listen} -> {args.to}, {args.delay_ms} ms each way", flush=True)
    while time.monotonic() < deadline:
        for port in listening_ports(args.to) - served:
            served.add(port)
            threading.Thread(
                target=serve_port, args=(args.listen, args.to, port, delay_s), daemon=True
            ).start()
            print(f"relaying port {port}", flush=True)
        time.sleep(SCAN_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
