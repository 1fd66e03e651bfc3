"""The NN worker's background loop and the asynchronous gradient sender."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading

import numpy as np
import pytest

from pyrsia.services.nn_worker.backward import BackwardEngine
from pyrsia.services.nn_worker.embedding_client import EmbeddingWorkerClient, normalize_address
from pyrsia.services.nn_worker.inflight import InflightLimits
from pyrsia.shared.constants import GIL_SWITCH_INTERVAL_S
from pyrsia.shared.errors import GradientSendError, InvalidInputError
from pyrsia.shared.runtime import Runtime, RuntimeClosedError
from tests.redis_server import free_port


@pytest.fixture
def runtime():
    rt = Runtime().start()
    yield rt
    rt.stop()


def test_run_submit_and_errors_cross_threads(runtime):
    async def add(a, b):
        await asyncio.sleep(0)
        return a + b

    async def boom():
        raise KeyError("x")

    assert runtime.run(add(1, 2)) == 3
    assert runtime.submit(add(2, 3)).result(5) == 5
    with pytest.raises(KeyError):
        runtime.run(boom())
    with pytest.raises(TimeoutError):
        runtime.run(asyncio.sleep(10), timeout_s=0.05)


def test_stop_cancels_running_work_and_refuses_more():
    rt = Runtime().start()
    started = rt.submit(asyncio.sleep(60))
    rt.stop()
    assert started.cancelled() or started.done()
    coro = asyncio.sleep(0)
    with pytest.raises(RuntimeClosedError):
        rt.submit(coro)


def test_failed_gradient_sends_surface_at_flush_and_release_permits(runtime):
    client = EmbeddingWorkerClient(runtime.client, addresses=[f"127.0.0.1:{free_port()}"])
    client.http.retries = 0
    engine = BackwardEngine(
        runtime, client, limits=InflightLimits(backward_buffer=2, backward_workers=1)
    )
    released = []
    grads = [("a", np.zeros((2, 4), np.float32))]
    engine.submit(0, 1, 1.0, grads, on_done=lambda: released.append(1))
    with pytest.raises(GradientSendError, match="not applied"):
        engine.flush()
    assert released == [1]
    engine.flush()  # reported once
    engine.submit(0, 2, 1.0, grads, on_done=lambda: released.append(2))
    runtime.run(asyncio.sleep(0.5))
    with pytest.raises(GradientSendError):  # the next submit reports the failed send
        engine.submit(0, 3, 1.0, grads)
    assert released == [1, 2]


def test_addresses_are_normalized_and_checked():
    assert normalize_address("localhost: 8888") == "http://localhost:8888"
    assert normalize_address("http://h:1/") == "http://h:1"
    with pytest.raises(InvalidInputError):
        normalize_address("no-port")


def test_inflight_limits_check_their_arguments_and_bound_the_slots():
    with pytest.raises(InvalidInputError, match="backward_buffer_size"):
        InflightLimits(backward_buffer=0)
    with pytest.raises(InvalidInputError, match="backward_workers_size"):
        InflightLimits(backward_workers=True)

    async def lookup_limits(staleness):
        return InflightLimits.for_lookups(
            num_workers=2, buffer_size=2, staleness=staleness, just_in_time=True
        )

    with pytest.raises(InvalidInputError, match="embedding_staleness"):
        asyncio.run(lookup_limits(-1))
    assert asyncio.run(lookup_limits(None)).permit_releaser() is None
    limits = InflightLimits(backward_buffer=1, backward_workers=3)
    limits.take_slot(lambda: True, contextlib.nullcontext)
    # the one slot is taken: a stopped runtime turns the wait into an error, not a hang
    with pytest.raises(RuntimeClosedError):
        limits.take_slot(lambda: False, contextlib.nullcontext)
    limits.give_slot()
    limits.take_slot(lambda: True, contextlib.nullcontext)  # free again
    limits.give_slot()


def test_staleness_permits_come_back_from_any_thread():
    async def scenario() -> int:
        limits = InflightLimits.for_lookups(
            num_workers=4, buffer_size=4, staleness=2, just_in_time=False
        )
        await limits.admit()
        await limits.admit()
        release = limits.permit_releaser()
        assert release is not None
        with pytest.raises(TimeoutError):  # both permits are out
            await asyncio.wait_for(limits.admit(), timeout=0.1)
        threading.Thread(target=release).start()  # e.g. the training thread after backward
        await asyncio.wait_for(limits.admit(), timeout=5)
        return 1

    assert asyncio.run(scenario()) == 1


def _switch_interval_after_start(preset: float | None) -> float:
    """The GIL switch interval of a fresh process after it started the runtime."""
    set_line = f"sys.setswitchinterval({preset!r}); " if preset is not None else ""
    code = (
        f"import sys; {set_line}"
        "from pyrsia.shared.runtime import Runtime; "
        "r = Runtime().start(); print(sys.getswitchinterval()); r.stop()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def test_runtime_shortens_python_default_gil_switch_interval():
    assert _switch_interval_after_start(None) == pytest.approx(GIL_SWITCH_INTERVAL_S)


def test_runtime_keeps_a_switch_interval_the_script_chose():
    assert _switch_interval_after_start(0.002) == pytest.approx(0.002)


def _start_together(runtime, threads: int) -> list[BaseException]:
    """``threads`` threads released at once, each starting ``runtime`` and running a coroutine."""
    import threading

    gate = threading.Barrier(threads)
    errors: list[BaseException] = []

    async def answer() -> int:
        return 42

    def use() -> None:
        gate.wait()
        try:
            assert runtime.start().run(answer()) == 42
        except BaseException as exc:  # collected for the caller's assertion
            errors.append(exc)

    started = [threading.Thread(target=use) for _ in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()
    return errors


def test_threads_starting_the_runtime_together_all_get_a_running_loop():
    """A thread calling start() while another's start is still bringing the loop up must
    wait for it, not return early and find no loop (persia.helper starts data-loader and
    NN-worker functions in threads of one process)."""
    from pyrsia.shared.runtime import Runtime

    for _ in range(10):
        runtime = Runtime()
        errors = _start_together(runtime, 8)
        runtime.stop()
        assert not errors, errors
