"""The embedding worker as a real service: two PS replicas, buffers, gradients, failures."""

import asyncio
import time

import numpy as np
import pytest

from persia.embedding.data import IDTypeFeature, IDTypeFeatureWithSingleID, Label, PersiaBatch
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from pyrsia.shared.errors import BackPressureError, ConflictError, NotFoundError
from pyrsia.shared.http_client import HttpClient, RemoteBadRequestError

EMBEDDING_YML = """
slots_config:
  user: {dim: 4}
  tags: {dim: 4, sqrt_scaling: true}
  seq: {dim: 4, embedding_summation: false, sample_fixed_size: 3}
"""


def global_yml(buffer=1000, expire=1000):
    return f"""
embedding_parameter_server_config: {{capacity: 100000, num_hashmap_internal_shards: 2}}
embedding_worker_config: {{forward_buffer_size: {buffer}, buffered_data_expired_sec: {expire}}}
"""


@pytest.fixture
def configs(tmp_path):
    def make(**kw):
        emb, glob = (
            tmp_path / "embedding_config.yml",
            tmp_path / f"global_{time.monotonic_ns()}.yml",
        )
        emb.write_text(EMBEDDING_YML)
        glob.write_text(global_yml(**kw))
        return ["--embedding-config", str(emb), "--global-config", str(glob)]

    return make


def start_cluster(services, flags, n_ps=2, n_workers=1):
    ps = [
        services(
            "pyrsia.services.embedding_ps",
            [*flags, "--port", "0", "--replica-index", str(i), "--replica-size", str(n_ps)],
            role=ROLE_EMBEDDING_PS,
            replica_index=i,
            wait_ready=False,
        )
        for i in range(n_ps)
    ]
    workers = [
        services(
            "pyrsia.services.embedding_worker",
            [*flags, "--port", "0", "--replica-index", str(i), "--replica-size", str(n_workers)],
            role=ROLE_EMBEDDING_WORKER,
            replica_index=i,
        )
        for i in range(n_workers)
    ]
    return ps, workers


def make_batch(seed=0, n=5, requires_grad=True):
    rng = np.random.default_rng(seed)
    tags = [rng.integers(0, 20, size=k, dtype=np.uint64) for k in rng.integers(0, 4, size=n)]
    seq = [rng.integers(0, 20, size=k, dtype=np.uint64) for k in rng.integers(0, 6, size=n)]
    return PersiaBatch(
        [
            IDTypeFeatureWithSingleID("user", rng.integers(0, 50, size=n, dtype=np.uint64)),
            IDTypeFeature("tags", tags),
            IDTypeFeature("seq", seq),
        ],
        labels=[Label(np.zeros((n, 1), np.float32))] if requires_grad else None,
        requires_grad=requires_grad,
    )


@pytest.fixture
async def client():
    c = HttpClient(retries=0)
    yield c
    await c.close()


async def setup_training(client, worker_url, lr=1.0):
    hyper = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
    await client.call(f"{worker_url}/configure", {"hyperparams": hyper})
    await client.call(f"{worker_url}/register_optimizer", {"optimizer": {"type": "sgd", "lr": lr}})


async def test_two_workers_two_ps_lookup_and_gradients(services, configs, client):
    _, (w0, w1) = start_cluster(services, configs(), n_ps=2, n_workers=2)
    await setup_training(client, w0.url)
    batch = make_batch()
    ref = await client.call(
        f"{w0.url}/batch", {"loader": 0, "batch_id": 0, "batch": batch.id_part().to_wire()}
    )
    assert ref == {"worker": 0, "batch_id": 0}
    out = await client.call(f"{w0.url}/lookup", {"batch_id": 0, "train": True})
    emb = {e["name"]: e["data"] for e in out["embeddings"]}
    assert (
        emb["user"].shape == (5, 4)
        and emb["tags"].shape == (5, 4)
        and emb["seq"].shape == (5, 3, 5)
    )
    # the other worker sees the same PS tables
    direct = await client.call(
        f"{w1.url}/lookup_direct",
        {"batch": make_batch(requires_grad=False).id_part().to_wire(), "train": False},
    )
    assert direct["batch_id"] is None
    for e in direct["embeddings"]:
        np.testing.assert_allclose(e["data"], emb[e["name"]], rtol=1e-6)
    # SGD lr=1 on the single-id slot: each user's embedding moves by -(sum of its grads)
    g = np.arange(20, dtype=np.float32).reshape(5, 4) / 100
    res = await client.call(
        f"{w0.url}/gradients",
        {"batch_id": 0, "loss_scale": 2.0, "gradients": [{"name": "user", "data": g * 2}]},
    )
    assert res["skipped_slots"] == [] and res["dropped"] == 0 and res["applied"] > 0
    after = await client.call(
        f"{w1.url}/lookup_direct",
        {"batch": make_batch(requires_grad=False).id_part().to_wire(), "train": False},
    )
    users = batch.id_type_features[0].data
    expected = emb["user"].copy()
    for u in np.unique(users):  # reference: per distinct id, the sum over its occurrences
        expected[users == u] -= g[users == u].sum(axis=0)
    np.testing.assert_allclose(after["embeddings"][0]["data"], expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(NotFoundError, match="unknown"):  # gradients are consumed once
        await client.call(f"{w0.url}/gradients", {"batch_id": 0, "gradients": []})


async def test_nan_gradient_slot_is_skipped_and_counted(services, configs, client):
    _, (w,) = start_cluster(services, configs(), n_ps=1)
    await setup_training(client, w.url)
    batch = make_batch()
    await client.call(
        f"{w.url}/batch", {"loader": 0, "batch_id": 3, "batch": batch.id_part().to_wire()}
    )
    out = await client.call(f"{w.url}/lookup", {"batch_id": 3, "train": True})
    bad = np.full((5, 4), np.nan, np.float32)
    res = await client.call(
        f"{w.url}/gradients", {"batch_id": 3, "gradients": [{"name": "user", "data": bad}]}
    )
    assert res["skipped_slots"] == ["user"] and res["applied"] == 0
    again = await client.call(
        f"{w.url}/lookup_direct", {"batch": batch.id_part().to_wire(), "train": False}
    )
    np.testing.assert_array_equal(again["embeddings"][0]["data"], out["embeddings"][0]["data"])
    metrics = await (await client._get_session().get(f"{w.url}/metrics")).text()
    assert 'pyrsia_ew_nan_skipped_slots_total{slot="user"} 1.0' in metrics
    # the first lookup is sampled for the unique-id rate: 5 ids of slot "user", each distinct or not
    users = len(np.unique(batch.id_type_features[0].data))
    assert 'pyrsia_ew_sampled_slot_ids_total{slot="user"} 5.0' in metrics
    assert f'pyrsia_ew_sampled_slot_unique_ids_total{{slot="user"}} {float(users)}' in metrics


async def test_back_pressure_duplicates_and_dropped_references(services, configs, client):
    _, (w,) = start_cluster(services, configs(buffer=2, expire=1), n_ps=1)
    await setup_training(client, w.url)
    body = make_batch().id_part().to_wire()
    for i in range(2):
        await client.call(f"{w.url}/batch", {"loader": 0, "batch_id": i, "batch": body})
    with pytest.raises(BackPressureError):
        await client.call(f"{w.url}/batch", {"loader": 0, "batch_id": 2, "batch": body})
    # another loader has its own share of the buffer
    await client.call(f"{w.url}/batch", {"loader": 1, "batch_id": 5, "batch": body})
    with pytest.raises(ConflictError):
        await client.call(f"{w.url}/batch", {"loader": 1, "batch_id": 5, "batch": body})

    async def lookup_soon():
        await asyncio.sleep(0.2)
        await client.call(f"{w.url}/lookup", {"batch_id": 0, "train": False})

    consumer = asyncio.create_task(lookup_soon())  # 429 until a slot frees, then success
    await client.call(
        f"{w.url}/batch", {"loader": 0, "batch_id": 2, "batch": body}, until=time.monotonic() + 10
    )
    await consumer
    await asyncio.sleep(1.2)
    with pytest.raises(NotFoundError, match="batch 1 was dropped .expired"):
        await client.call(f"{w.url}/lookup", {"batch_id": 1, "train": True})
    with pytest.raises(NotFoundError, match="batch 99 is unknown"):
        await client.call(f"{w.url}/lookup", {"batch_id": 99, "train": True})


async def test_bad_batches_are_400_naming_the_field(services, configs, client):
    _, (w,) = start_cluster(services, configs(), n_ps=1)
    good = make_batch().id_part().to_wire()
    cases = [
        (
            {**good, "id_type_features": [{**good["id_type_features"][0], "name": "nope"}]},
            "id_type_features[0].name",
        ),
        (
            {
                **good,
                "id_type_features": [
                    {
                        **good["id_type_features"][0],
                        "ids": good["id_type_features"][0]["ids"].astype(np.int64),
                    }
                ],
            },
            "id_type_features[0].ids",
        ),
        # "user" has one id per sample, sent without offsets: its ids must number batch_size
        ({**good, "batch_size": 7}, "batch.id_type_features[0].ids"),
        (
            {**good, "batch_size": 7, "id_type_features": good["id_type_features"][1:]},
            "batch.id_type_features[0].offsets",
        ),
        ({**good, "batch_size": 0}, "batch.batch_size"),
        ({**good, "id_type_features": []}, "batch.id_type_features"),
    ]
    for batch, field in cases:
        with pytest.raises(RemoteBadRequestError) as err:
            await client.call(f"{w.url}/batch", {"loader": 0, "batch_id": 1, "batch": batch})
        assert field in err.value.body["field"], err.value.body
    assert w.health()[0] == 200


async def test_killed_ps_replica_is_re_resolved_after_restart(services, configs, client):
    flags = configs()
    (ps0, ps1), (w,) = start_cluster(services, flags, n_ps=2)
    await setup_training(client, w.url)
    body = make_batch(requires_grad=False).id_part().to_wire()
    before = await client.call(f"{w.url}/lookup_direct", {"batch": body, "train": False})
    ps1.kill()
    services(
        "pyrsia.services.embedding_ps",
        [*flags, "--port", "0", "--replica-index", "1", "--replica-size", "2"],
        role=ROLE_EMBEDDING_PS,
        replica_index=1,
        wait_ready=False,
        timeout_s=60,
    )
    # the restarted replica is empty, configured again by the worker, and answers lookups
    after = await client.call(
        f"{w.url}/lookup_direct", {"batch": body, "train": False}, timeout_s=60
    )
    assert [e["data"].shape for e in after["embeddings"]] == [
        e["data"].shape for e in before["embeddings"]
    ]
    assert w.health()[0] == 200
