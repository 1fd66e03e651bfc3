"""A service's numeric work runs inline when small and its pool is idle, in the pool
otherwise (pyrsia/shared/thread_offload.py); the embedding worker keeps a Census-Income batch inline."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pyrsia.shared.constants import EW_INLINE_WORK_MAX_IDS, INLINE_WORK_MAX_IDS
from pyrsia.shared.thread_offload import Offloader

CENSUS_BATCH_IDS = 1024 * 33  # one id per sample in each of 33 slots


def where(offloader: Offloader, n_ids: int | None) -> str:
    async def main() -> str:
        loop_thread = threading.get_ident()
        ran_on = await offloader.run(n_ids, threading.get_ident)
        return "loop" if ran_on == loop_thread else "pool"

    return asyncio.run(main())


@pytest.fixture
def pool():
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-offload")
    yield executor
    executor.shutdown(wait=True)


def test_small_work_runs_on_the_loop_and_starts_no_thread(pool):
    offloader = Offloader(pool, max_inline_ids=100)
    assert where(offloader, 100) == "loop"
    assert not pool._threads  # the pool never woke a thread


def test_large_or_unbounded_work_goes_to_the_pool(pool):
    offloader = Offloader(pool, max_inline_ids=100)
    assert where(offloader, 101) == "pool"
    assert where(offloader, None) == "pool"
    assert offloader.idle


def test_small_work_waits_its_turn_in_the_pool_while_a_job_runs(pool):
    offloader = Offloader(pool, max_inline_ids=100)
    release = threading.Event()

    async def main() -> tuple[str, str]:
        loop_thread = threading.get_ident()
        big = asyncio.ensure_future(offloader.run(None, release.wait, 5.0))
        await asyncio.sleep(0.05)  # the big job holds the pool
        small = await offloader.run(1, threading.get_ident)
        release.set()
        await big
        return ("loop" if small == loop_thread else "pool"), str(offloader.idle)

    assert asyncio.run(main()) == ("pool", "True")


def test_the_embedding_workers_bound_keeps_a_census_batch_on_its_loop(pool):
    assert INLINE_WORK_MAX_IDS < CENSUS_BATCH_IDS <= EW_INLINE_WORK_MAX_IDS
    assert where(Offloader(pool, max_inline_ids=EW_INLINE_WORK_MAX_IDS), CENSUS_BATCH_IDS) == "loop"
    assert where(Offloader(pool), CENSUS_BATCH_IDS) == "pool"  # the PS's bound would not
