"""Per-slot id counters kept in numpy arrays (pyrsia/services/embedding_worker/slot_counts.py):
what a scrape reads is what the batches added, slot by slot."""

import numpy as np
import prometheus_client as prom

from pyrsia.services.embedding_worker.slot_counts import SlotIdCounts


def test_batches_add_up_per_slot_and_read_as_prometheus_counters():
    registry = prom.CollectorRegistry(auto_describe=True)
    counts = SlotIdCounts()
    registry.register(counts)
    counts.add(["user", "item"], np.array([4.0, 6.0]))
    counts.add(["item", "tags"], np.array([1.0, 7.0]), np.array([1.0, 3.0]))  # sampled
    counts.add(["user"], np.array([2.0]))

    def read(metric: str, slot: str) -> float | None:
        return registry.get_sample_value(f"pyrsia_ew_{metric}_total", {"slot": slot})

    assert [read("slot_ids", s) for s in ("user", "item", "tags")] == [6.0, 7.0, 7.0]
    assert [read("sampled_slot_ids", s) for s in ("user", "item", "tags")] == [0.0, 1.0, 7.0]
    assert read("sampled_slot_unique_ids", "tags") == 3.0
    assert read("slot_ids", "never") is None
    text = prom.generate_latest(registry).decode()
    assert 'pyrsia_ew_slot_ids_total{slot="item"} 7.0' in text
    assert "# TYPE pyrsia_ew_sampled_slot_unique_ids_total counter" in text
