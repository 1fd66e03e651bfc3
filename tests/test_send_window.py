"""The data loaders' window of sends under way (pyrsia/shared/send_window.py), with real
futures finished from another thread as the event loop finishes a send."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from pyrsia.shared.send_window import SendWindow


def _finish_later(
    future: concurrent.futures.Future, delay_s: float, error: Exception | None = None
):
    def finish() -> None:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    timer = threading.Timer(delay_s, finish)
    timer.start()
    return timer


def _window_with(limit: int, sends: int) -> tuple[SendWindow, list[concurrent.futures.Future]]:
    """A window of ``limit`` with ``sends`` sends under way."""
    window = SendWindow(limit)
    futures = [concurrent.futures.Future() for _ in range(sends)]
    for future in futures:
        window.add(future)
    return window, futures


def test_make_room_waits_only_while_the_window_is_full():
    window = SendWindow(2)
    first, second = concurrent.futures.Future(), concurrent.futures.Future()
    for future in (first, second):
        window.make_room()  # room: returns at once
        window.add(future)
    assert len(window) == 2
    _finish_later(second, 0.2)  # the later send finishes first
    started = time.monotonic()
    window.make_room()
    assert time.monotonic() - started >= 0.15  # it waited for a send to finish
    assert len(window) == 1  # the finished one is collected, the other still under way
    first.set_result(None)
    window.make_room()
    assert len(window) == 0


def test_a_failed_send_is_raised_at_the_next_call_and_again_until_cancel():
    window = SendWindow(4)
    ok, bad = concurrent.futures.Future(), concurrent.futures.Future()
    window.add(ok)
    window.add(bad)
    ok.set_result(None)
    bad.set_exception(ValueError("send 2 refused"))
    for _ in range(2):
        with pytest.raises(ValueError, match="send 2 refused"):
            window.make_room()
    with pytest.raises(ValueError, match="send 2 refused"):
        window.drain()
    window.cancel()
    window.make_room()
    window.drain()
    assert len(window) == 0


def test_a_send_cancelled_under_way_is_raised_as_cancelled():
    window = SendWindow(1)
    future = concurrent.futures.Future()
    window.add(future)
    future.cancel()  # the runtime stopped: its task was cancelled
    with pytest.raises(concurrent.futures.CancelledError):
        window.make_room()


def test_drain_waits_for_every_send_and_raises_the_first_error():
    window, futures = _window_with(3, 3)
    _finish_later(futures[0], 0.05)
    _finish_later(futures[1], 0.1)
    _finish_later(futures[2], 0.15)
    window.drain()
    assert len(window) == 0 and all(f.done() for f in futures)
    failing = concurrent.futures.Future()
    window.add(failing)
    _finish_later(failing, 0.05, RuntimeError("lost"))
    with pytest.raises(RuntimeError, match="lost"):
        window.drain()


def test_cancel_cancels_the_sends_under_way_and_empties_the_window():
    window, futures = _window_with(2, 2)
    window.cancel()
    assert all(f.cancelled() for f in futures)
    assert len(window) == 0
    window.make_room()  # nothing under way: no wait, nothing raised


def test_a_send_that_finished_before_it_was_added_takes_no_room():
    window = SendWindow(1)
    done = concurrent.futures.Future()
    done.set_result(None)
    window.add(done)
    window.make_room()  # would wait for ever if the finished send still counted
    assert len(window) == 0


def test_the_limit_is_validated():
    with pytest.raises(ValueError, match="max_inflight"):
        SendWindow(0)
