"""PERSIA's metric names on a real job's /metrics (issue 49, item 5).

A job trains a few batches against a real PS and embedding worker; their ``/metrics`` are
scraped and every series PERSIA's Grafana board ("Persia", ``perisa-training.json`` in
PERSIA's repository) queries is there, with PERSIA's labels ``instance`` (``rep_<i>``) and
``ip_addr``, and values that fit their meaning.
"""

from __future__ import annotations

import re
import urllib.request
import uuid

import torch

from persia.data import DataLoader, IterableDataset
from tests.nn_helpers import SmallModel, environ, job_services, make_batch, small_train_ctx

BOARD = (
    "staleness",
    "num_pending_batches",
    "batch_unique_indices_rate",
    "index_miss_ratio",
    "index_miss_count",
    "gradient_id_miss_count",
    "lookup_hashmap_time_cost_sec",
    "lookup_preprocess_time_cost_sec",
    "lookup_rpc_time_cost_sec",
    "update_gradient_time_cost_sec",
    "lookup_postprocess_time_cost_sec",
    "lookup_total_time_cost_sec",
)
"""Every metric PERSIA's board queries (its panels' ``expr``, each ``<name>{}``)."""
SAMPLE = re.compile(r"^([a-z_]+)\{([^}]*)\} (\S+)$")


class _Batches(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def test_a_jobs_services_serve_every_name_persias_board_queries(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"pm-{uuid.uuid4().hex[:8]}"}
    batches = [make_batch([10 * k + 1, 10 * k + 2, 10 * k + 1], seed=k) for k in range(4)]
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
        with job_services(env, tmp_path / "svc") as (ps, worker):
            model = SmallModel()
            with small_train_ctx(model) as ctx:
                for batch in DataLoader(_Batches(batches), embedding_staleness=1):
                    output, labels = ctx.forward(batch)
                    ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
            served = {**_scrape(ps.url), **_scrape(worker.url)}
    missing = [name for name in BOARD if name not in served]
    assert not missing, f"PERSIA's board queries {missing}, not served"
    host = ps.address.rsplit(":", 1)[0]
    for name in BOARD:
        for labels, _ in served[name]:
            assert labels["instance"] == "rep_0" and labels["ip_addr"] == host, (name, labels)
    value = {name: served[name][0][1] for name in BOARD}
    assert value["index_miss_count"] >= 8  # every id was new on its first lookup
    assert 0 < value["index_miss_ratio"] <= 1
    for name in (
        "lookup_hashmap_time_cost_sec",
        "lookup_rpc_time_cost_sec",
        "lookup_total_time_cost_sec",
        "update_gradient_time_cost_sec",
    ):
        assert value[name] > 0, name
    assert value["lookup_total_time_cost_sec"] >= value["lookup_rpc_time_cost_sec"]
    assert value["staleness"] == 0 and value["num_pending_batches"] == 0  # all applied
    rates = {labels["feat"]: v for labels, v in served["batch_unique_indices_rate"]}
    assert rates and all(0 < v <= 1 for v in rates.values()), rates


def test_nan_count_counts_skipped_slot_gradients_per_feature():
    import prometheus_client as prom

    from pyrsia.services.embedding_worker.persia_metrics import WorkerPersiaMetrics

    metrics = WorkerPersiaMetrics(lambda: ["rep_1", "10.0.0.5"], lambda: (2, 3))
    metrics.nan_skipped(["age", "age", "city"])
    registry = prom.CollectorRegistry()
    registry.register(metrics)
    text = prom.generate_latest(registry).decode()
    assert 'nan_count{feat="age",instance="rep_1",ip_addr="10.0.0.5"} 2.0' in text
    assert 'nan_count{feat="city",instance="rep_1",ip_addr="10.0.0.5"} 1.0' in text
    assert 'staleness{instance="rep_1",ip_addr="10.0.0.5"} 2.0' in text
