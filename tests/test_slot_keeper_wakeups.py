"""The job-lease thread of ``persia-launcher nn-worker`` and ``data-loader`` sleeps between
heartbeats (pyrsia/shared/slot_keeper.py).

Both launchers share the machine with the NN worker's training threads; a thread that wakes
ten times a second to look at a flag takes a core (and the GIL of the data loader's script)
for nothing. The keeper waits for its next heartbeat or for ``stop()``, whichever comes
first, and still stops at once. Real redis-server, real thread, the kernel's own count of
the thread's wake-ups (``/proc/self/task/<tid>/status``).
"""

from __future__ import annotations

import threading
import time

import pytest

from pyrsia.shared.registry import RegistrySettings
from pyrsia.shared.slot_keeper import SlotKeeper


def _voluntary_switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as fh:
        for line in fh:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc status")


def _keeper_thread() -> threading.Thread:
    (thread,) = [t for t in threading.enumerate() if t.name == "pyrsia-job-lease"]
    return thread


@pytest.mark.timeout(30)
def test_the_lease_thread_sleeps_between_heartbeats_and_stops_at_once(registry_settings):
    keeper = SlotKeeper("data_loader", 0, 1, registry_settings)
    keeper.start()
    try:
        thread = _keeper_thread()
        assert thread.native_id is not None
        time.sleep(0.1)  # past the start's own switches
        before = _voluntary_switches(thread.native_id)
        time.sleep(1.0)  # shorter than a heartbeat (1.5 s): nothing to do
        woke = _voluntary_switches(thread.native_id) - before
        assert woke <= 2, f"the lease thread woke {woke} times in 1 s with nothing to do"
    finally:
        began = time.monotonic()
        keeper.stop()
        stopped_in = time.monotonic() - began
    assert not thread.is_alive()
    assert stopped_in < 1.0, f"stop() took {stopped_in:.2f} s"


@pytest.mark.timeout(30)
def test_the_lease_thread_still_refreshes_its_slot(redis_server, registry_settings, monkeypatch):
    """Between heartbeats it sleeps; at each heartbeat it renews the slot in Redis."""
    import pyrsia.shared.slot_keeper as slot_keeper

    refreshed = threading.Event()
    real_refresh = slot_keeper.Registry

    class CountingRegistry(real_refresh):
        def __init__(self, settings: RegistrySettings):
            super().__init__(settings, heartbeat_s=0.2)
            lease_refresh = self.lease.refresh

            async def refresh(role: str, index: int) -> bool:
                answer = await lease_refresh(role, index)
                refreshed.set()
                return answer

            self.lease.refresh = refresh

    monkeypatch.setattr(slot_keeper, "Registry", CountingRegistry)
    keeper = SlotKeeper("data_loader", 0, 1, registry_settings)
    keeper.start()
    try:
        assert refreshed.wait(5.0), "the slot was not refreshed within 25 heartbeats"
    finally:
        keeper.stop()
