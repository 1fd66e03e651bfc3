"""The middlewares around every route of a Pyrsia service, and the error answers they make.

``error_middleware`` maps every failure to a status and a msgpack body
``{"error", "message", ...}`` (never a traceback); around every route but ``/health`` and
``/metrics`` it also refuses new work while the service drains (503), counts the requests in
flight, and applies ``pyrsia.shared.http_body``'s limits before the handler reads a body: a
``Content-Length`` over the cap is a 413, and the body is reserved under the in-flight bound
(503 + ``Retry-After`` when no room comes in time) until the answer is made.
``auth_middleware`` answers 401 to a request without the job's token. ``make_app``
(``pyrsia.shared.http_server``) installs both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from pyrsia.shared.auth import AUTH_HEADER, AUTH_SCHEME, is_authorized
from pyrsia.shared.codec import packb
from pyrsia.shared.constants import (
    ENV_MAX_MESSAGE_BYTES,
    INFLIGHT_BYTES_WAIT_S,
    MSGPACK_CONTENT_TYPE,
)
from pyrsia.shared.errors import (
    InvalidInputError,
    PayloadTooLargeError,
    PersiaError,
    ServiceUnavailableError,
)
from pyrsia.shared.service_state import STATE, ServiceState

# the server's log lines keep its logger's name (what a log filter or a reader looks for)
log = logging.getLogger("pyrsia.shared.http_server")

CHUNKED_HOLD = "pyrsia_chunked_hold"
"""Request key of a chunked body's ``[bytes reserved]``, given back by the middleware."""
BODY_DROPPED = "pyrsia_body_dropped"
"""Request key set by ``read_body`` once it has logged a body that never arrived in full."""

_UNGUARDED = frozenset({"/health", "/metrics"})


def error_body(error: str, message: str, **extra: Any) -> bytes:
    """The msgpack body of an error answer: ``{"error", "message", ...}``."""
    return packb({"error": error, "message": message, **extra})


def _error_response(status: int, error: str, message: str, **extra: Any) -> web.Response:
    return web.Response(
        status=status, body=error_body(error, message, **extra), content_type=MSGPACK_CONTENT_TYPE
    )


def _error_fields(exc: PersiaError) -> dict[str, Any]:
    """The extra fields of an error body: what the sender needs to fix its request."""
    if isinstance(exc, InvalidInputError):
        return {"field": exc.field, "expected": exc.expected}
    if isinstance(exc, PayloadTooLargeError) and exc.limit is not None:
        return {"limit": exc.limit}
    return {}


def _persia_error_response(exc: PersiaError) -> web.Response:
    response = _error_response(exc.status, exc.kind, str(exc), **_error_fields(exc))
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response


def _too_large(state: ServiceState) -> web.Response:
    limit = state.max_body_bytes
    message = f"request body is over the {limit}-byte cap ({ENV_MAX_MESSAGE_BYTES})"
    return _error_response(PayloadTooLargeError.status, "too_large", message, limit=limit)


def _refuse_unread(response: web.Response) -> web.Response:
    """Close the connection after ``response``, whose request body was not (all) read.

    aiohttp still reads and drops what the client sends for a while (its lingering time)
    before closing, so the client gets this answer rather than a reset."""
    response.force_close()
    return response


def _internal_error(request: web.Request) -> web.Response:
    """Log the exception being handled with its traceback; answer 500 without it."""
    log.exception("internal error on %s %s", request.method, request.path)
    return _error_response(500, "internal_error", "internal error; see the service log")


async def _reserve_body(
    request: web.Request, state: ServiceState
) -> tuple[web.Response | None, int, list[int] | None]:
    """Admit a guarded request's body before the handler reads it.

    Returns ``(refusal, held, chunked)``: a refusal to answer at once (413 over the cap,
    503 + ``Retry-After`` when the in-flight bound has no room within
    ``INFLIGHT_BYTES_WAIT_S``), else the ``Content-Length`` bytes now reserved, or for a
    chunked body the ``[bytes reserved]`` that ``read_body`` fills as chunks arrive.
    """
    length = request.content_length
    if length:
        if length > state.max_body_bytes:
            state.refused["too_large"] += 1
            return _refuse_unread(_too_large(state)), 0, None
        if not state.inflight_bytes.take_now(length):
            try:
                await state.inflight_bytes.take(length, INFLIGHT_BYTES_WAIT_S)
            except ServiceUnavailableError as exc:
                state.refused["inflight_bytes"] += 1
                return _refuse_unread(_persia_error_response(exc)), 0, None
        return None, length, None
    if length is None and request.body_exists:  # chunked: reserved as it arrives
        chunked = request[CHUNKED_HOLD] = [0]
        return None, 0, chunked
    return None, 0, None


def _release(
    state: ServiceState, task: asyncio.Task | None, held: int, chunked: list[int] | None
) -> None:
    """A guarded request is done: count it out and give back the body bytes it reserved."""
    state.inflight -= 1
    state.handlers.discard(task)
    if state.inflight == 0:
        state.idle.set()
    if held:
        state.inflight_bytes.give(held)
    elif chunked is not None and chunked[0]:
        state.inflight_bytes.give(chunked[0])


@web.middleware
async def error_middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Map every failure to a status and a msgpack body; never leak a traceback.

    Before the handler runs, a body's ``Content-Length`` is checked against the cap (413)
    and reserved under the in-flight bound (503 + ``Retry-After`` when no room comes within
    ``INFLIGHT_BYTES_WAIT_S``); the reservation is given back once the answer is made.
    """
    state = request.app[STATE]
    guarded = request.path not in _UNGUARDED
    if guarded and state.draining:
        return _error_response(503, "unavailable", f"{state.name} is shutting down")
    task = asyncio.current_task()
    held = 0
    chunked: list[int] | None = None
    if guarded:
        state.inflight += 1
        state.idle.clear()
        if task is not None:
            state.handlers.add(task)
    try:
        if guarded:
            refusal, held, chunked = await _reserve_body(request, state)
            if refusal is not None:
                return refusal
        return await handler(request)
    except ConnectionResetError as exc:
        if not request.get(BODY_DROPPED):
            return _internal_error(request)
        # logged once by read_body; the connection is closed, so this answer goes nowhere
        return _refuse_unread(_error_response(408, "request_timeout", str(exc)))
    except web.HTTPRequestEntityTooLarge:
        return _refuse_unread(_too_large(state))
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or "")
        raise
    except PersiaError as exc:
        if exc.status >= 500:
            log.warning("%s %s failed: %s", request.method, request.path, exc)
        response = _persia_error_response(exc)
        return _refuse_unread(response) if not request.content.is_eof() else response
    except asyncio.CancelledError:
        raise
    except Exception:
        return _internal_error(request)
    finally:
        if guarded:
            _release(state, task, held, chunked)


def auth_middleware(token: str) -> Callable:
    """Answer 401 to any request whose ``Authorization`` header does not carry ``token``.

    It runs before anything else (before the body is read), on every route.
    """

    @web.middleware
    async def check(request: web.Request, handler: Callable) -> web.StreamResponse:
        if not is_authorized(request.headers.get(AUTH_HEADER), token):
            response = _error_response(
                401,
                "unauthorized",
                f"missing or wrong '{AUTH_HEADER}: {AUTH_SCHEME} <token>' header: every "
                "process of the job needs the same PERSIA_AUTH_TOKEN",
            )
            response.headers["WWW-Authenticate"] = AUTH_SCHEME
            return response
        return await handler(request)

    return check
