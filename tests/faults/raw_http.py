"""A blocking HTTP client for the fault and fuzz suites: sends exactly the bytes it is given.

``pyrsia.shared.http_client`` encodes, retries and translates errors, which is right for the
services and wrong for a fuzzer: here every request is one attempt with raw bytes, and
the answer is ``(status, decoded body or raw bytes)``. ``truncated_post`` announces a
longer body than it sends and hangs up, which no well-behaved client can do.
"""

from __future__ import annotations

import http.client
import os
import socket
from typing import Any
from urllib.parse import urlsplit

from pyrsia.shared.codec import unpackb
from pyrsia.shared.errors import ProtocolError


def auth_headers() -> dict[str, str]:
    token = os.environ.get("PERSIA_AUTH_TOKEN")  # a test helper reads its own environment
    return {"Authorization": f"Bearer {token}"} if token else {}


class RawClient:
    """One keep-alive connection to ``url`` (reopened after errors)."""

    def __init__(self, url: str, timeout_s: float = 60.0):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, Any]:
        """``(status, answer)``; the answer is decoded msgpack/JSON when it decodes, else bytes."""
        all_headers = {"Content-Type": "application/msgpack", **auth_headers(), **(headers or {})}
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=all_headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                if resp.will_close:
                    self.close()
                break
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                # a keep-alive connection the server closed between requests: reconnect once
                self.close()
                if attempt:
                    raise
        return status, decode(raw)

    def post(self, path: str, body: bytes | None) -> tuple[int, Any]:
        return self.request("POST", path, body)


def decode(raw: bytes) -> Any:
    if not raw:
        return None
    if raw[:1] in (b"{", b"["):
        import json

        try:
            return json.loads(raw)
        except ValueError:
            pass
    try:
        return unpackb(raw)
    except ProtocolError:
        return raw


def truncated_post(
    url: str, path: str, body: bytes, announced: int, timeout_s: float = 5.0
) -> None:
    """Send headers announcing ``announced`` body bytes, send ``body`` (fewer), and hang up."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {parts.hostname}",
            f"Content-Length: {announced}",
            "Content-Type: application/msgpack",
        ]
        head += [f"{k}: {v}" for k, v in auth_headers().items()]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        sock.shutdown(socket.SHUT_WR)
        try:
            sock.recv(65536)  # whatever the server says (often nothing) before it closes
        except OSError:
            pass
