"""pyrsia.shared.http_body in-process: the in-flight byte bound and its settings."""

from __future__ import annotations

import asyncio

import pytest

from pyrsia.shared.constants import INFLIGHT_BYTES_RETRY_AFTER_S
from pyrsia.shared.errors import ConfigError, ServiceUnavailableError
from pyrsia.shared.http_body import InflightBytes, body_timeout_s, max_inflight_request_bytes
from pyrsia.shared.http_server import make_app
from pyrsia.shared.settings import Settings

MiB = 1 << 20


async def test_waiters_are_admitted_in_order_and_small_ones_do_not_overtake():
    budget = InflightBytes(10)
    assert budget.take_now(6)
    big = asyncio.create_task(budget.take(6, wait_s=5))
    await asyncio.sleep(0)
    assert not budget.take_now(1), "a small body must not overtake the large one waiting"
    budget.give(6)
    await big
    assert budget.held == 6 and budget.peak == 6
    budget.give(6)
    assert budget.held == 0


async def test_no_room_in_time_is_a_503_with_retry_after_and_leaves_nothing_held():
    budget = InflightBytes(10)
    assert budget.take_now(8)
    with pytest.raises(ServiceUnavailableError, match="PYRSIA_MAX_INFLIGHT_REQUEST_BYTES") as err:
        await budget.take(5, wait_s=0.05)
    assert err.value.retry_after_s == INFLIGHT_BYTES_RETRY_AFTER_S
    assert budget.held == 8
    assert budget.take_now(2), "the timed-out waiter must not block the queue"
    with pytest.raises(ServiceUnavailableError):
        await budget.take(11, wait_s=5)  # more than the bound can ever hold: at once


async def test_a_cancelled_waiter_lets_the_next_one_in():
    budget = InflightBytes(10)
    assert budget.take_now(10)
    first = asyncio.create_task(budget.take(10, wait_s=5))
    second = asyncio.create_task(budget.take(3, wait_s=5))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    budget.give(10)
    await asyncio.wait_for(second, 1)
    assert budget.held == 3


def _inflight(value: str) -> Settings:
    return Settings.from_env({"PYRSIA_MAX_INFLIGHT_REQUEST_BYTES": value})


def test_the_bound_is_at_least_one_cap_and_a_smaller_setting_is_refused():
    default = max_inflight_request_bytes(64 * MiB, Settings.from_env({}))
    assert 64 * MiB <= default <= 128 * MiB
    small = _inflight(str(32 * MiB))
    with pytest.raises(
        ConfigError, match="PYRSIA_MAX_INFLIGHT_REQUEST_BYTES.*under the per-request cap"
    ):
        max_inflight_request_bytes(64 * MiB, small)
    with pytest.raises(ConfigError, match="PYRSIA_MAX_INFLIGHT_REQUEST_BYTES"):
        make_app("t", client_max_size=64 * MiB, auth_token=None, settings=small)
    with pytest.raises(ConfigError, match="expected a positive integer"):
        max_inflight_request_bytes(MiB, _inflight("lots"))
    assert max_inflight_request_bytes(64 * MiB, _inflight(str(96 * MiB))) == 96 * MiB


def test_body_timeout_setting():
    assert body_timeout_s(Settings.from_env({})) == 30.0
    assert body_timeout_s(Settings.from_env({"PYRSIA_BODY_TIMEOUT_S": "2.5"})) == 2.5
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(ConfigError, match="PYRSIA_BODY_TIMEOUT_S: expected a positive number"):
            body_timeout_s(Settings.from_env({"PYRSIA_BODY_TIMEOUT_S": bad}))
