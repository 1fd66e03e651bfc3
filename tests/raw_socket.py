"""A raw socket HTTP/1.1 client for tests that must send exactly what they say: a head with
any ``Content-Length`` (or chunked), bodies in pieces at any pace, and a read of one answer
or of the server hanging up. ``pyrsia.shared.http_client`` would encode, retry and time out
on its own; ``tests/faults/raw_http.py`` sends whole requests through ``http.client``.
"""

from __future__ import annotations

import socket


def connect(url: str, timeout_s: float = 10.0) -> socket.socket:
    """A TCP connection to the service at ``url`` (``http://host:port``)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def head(path: str, length: int | None, *, chunked: bool = False) -> bytes:
    """A msgpack POST's head: ``Content-Length: length``, or chunked."""
    lines = [f"POST {path} HTTP/1.1", "Host: pyrsia", "Content-Type: application/msgpack"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one answer read from ``sock`` (Content-Length answers)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError(f"closed before an answer: {raw[:200]!r}")
        raw += got
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        got = sock.recv(65536)
        if not got:
            break
        body += got
    return status, headers, body[:length]


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True when the server closes the connection (EOF or reset) within ``within_s``."""
    sock.settimeout(within_s)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def post(url: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """One POST of ``body`` with its length, on a connection of its own; the answer."""
    with connect(url) as sock:
        sock.sendall(head(path, len(body)) + body)
        return read_answer(sock)
