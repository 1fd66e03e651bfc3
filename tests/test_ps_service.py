"""The embedding PS as a real service over loopback HTTP: readiness, bad input, shutdown."""

import numpy as np
import pytest

from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.errors import ServiceUnavailableError
from pyrsia.shared.http_client import HttpClient, RemoteBadRequestError
from pyrsia.shared.registry import Registry

HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}


@pytest.fixture
def ps(services, monkeypatch):
    monkeypatch.setenv("PYRSIA_MAX_MESSAGE_BYTES", str(1 << 20))
    return services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )


@pytest.fixture
async def client():
    c = HttpClient(retries=0)
    yield c
    await c.close()


async def ready(client, url, optimizer=None):
    await client.call(f"{url}/configure", {"hyperparams": HYPER})
    await client.call(
        f"{url}/register_optimizer", {"optimizer": optimizer or {"type": "sgd", "lr": 0.5}}
    )


async def test_not_ready_until_configured_and_given_an_optimizer(ps, client):
    status, body = ps.health()
    assert status == 503 and "not configured" in body["reason"] and "no optimizer" in body["reason"]
    with pytest.raises(ServiceUnavailableError, match="not ready"):
        await client.call(f"{ps.url}/lookup", {"train": True, "groups": []})
    await client.call(f"{ps.url}/configure", {"hyperparams": HYPER})
    assert "no optimizer" in ps.health()[1]["reason"]
    await client.call(f"{ps.url}/register_optimizer", {"optimizer": {"type": "adagrad", "lr": 0.1}})
    assert ps.health() == (200, ps.health()[1]) and ps.health()[1]["ready"]


async def test_eval_lookups_need_only_the_hyperparameters(ps, client):
    """PERSIA's PS served eval lookups before an optimizer was registered (its own
    test/test_ctx.py test_data_ctx relies on it); an eval lookup inserts nothing, so it
    needs no optimizer state. Train lookups still wait for the optimizer."""
    groups = [{"dim": 4, "ids": np.array([1, 2, 3], dtype=np.uint64)}]
    with pytest.raises(ServiceUnavailableError, match="not configured"):
        await client.call(f"{ps.url}/lookup", {"train": False, "groups": groups})
    await client.call(f"{ps.url}/configure", {"hyperparams": HYPER})
    answer = await client.call(f"{ps.url}/lookup", {"train": False, "groups": groups})
    assert len(answer["groups"]) == 1 and answer["groups"][0].shape == (3, 4)
    with pytest.raises(ServiceUnavailableError, match="no optimizer"):
        await client.call(f"{ps.url}/lookup", {"train": True, "groups": groups})
    stats = await client.call(f"{ps.url}/stats", {})
    assert stats["entries"] == 0  # the eval lookup inserted nothing


async def test_registers_and_answers_metrics(ps, registry_settings, client):
    reg = Registry(registry_settings)
    [record] = await reg.wait_for(ROLE_EMBEDDING_PS, timeout_s=5)
    assert record.url == ps.url
    await reg.close()
    text = await client._get_session().get(f"{ps.url}/metrics")
    assert "pyrsia_ps_entries" in await text.text()


BAD_REQUESTS = [
    (
        "/configure",
        {"hyperparams": {**HYPER, "admit_probability": 2.0}},
        "hyperparams.admit_probability",
    ),
    ("/configure", {"nothing": 1}, "hyperparams"),
    ("/register_optimizer", {"optimizer": {"type": "rmsprop", "lr": 0.1}}, "optimizer"),
    ("/register_optimizer", {"optimizer": {"type": "sgd", "lr": "fast"}}, "optimizer.lr"),
    (
        "/lookup",
        {"train": True, "groups": [{"dim": 4, "ids": np.arange(3, dtype=np.int64)}]},
        "groups[0].ids",
    ),
    ("/lookup", {"train": "yes", "groups": []}, "train"),
    (
        "/lookup",
        {"train": True, "groups": [{"dim": 0, "ids": np.arange(3, dtype=np.uint64)}]},
        "groups[0].dim",
    ),
    (
        "/update",
        {
            "groups": [
                {
                    "dim": 4,
                    "ids": np.arange(3, dtype=np.uint64),
                    "grads": np.ones((2, 4), np.float32),
                }
            ]
        },
        "groups[0].grads",
    ),
    (
        "/update",
        {
            "groups": [
                {
                    "dim": 4,
                    "ids": np.arange(3, dtype=np.uint64),
                    "grads": np.ones((3, 4), np.float64),
                }
            ]
        },
        "groups[0].grads",
    ),
    (
        "/lookup",
        {
            "train": True,
            "groups": [{"dim": 4, "ids": np.arange(3, dtype=np.uint64)}],
            "updates": [
                {
                    "groups": [
                        {
                            "dim": 4,
                            "ids": np.arange(3, dtype=np.uint64),
                            "grads": np.ones((2, 4), np.float32),
                        }
                    ]
                }
            ],
        },
        "updates[0].groups[0].grads",
    ),
    ("/dump", {"dir": 7}, "dir"),
    ("/load", {}, "dir"),
]


async def test_bad_input_is_a_400_naming_the_field_and_nothing_changes(ps, client):
    await ready(client, ps.url)
    ids = np.arange(10, dtype=np.uint64)
    before = (
        await client.call(f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 4, "ids": ids}]})
    )["groups"][0]
    for path, body, field in BAD_REQUESTS:
        with pytest.raises(RemoteBadRequestError) as err:
            await client.call(f"{ps.url}{path}", body)
        assert err.value.peer_status == 400
        assert err.value.body.get("field", "").startswith(field), (path, err.value.body)
    for garbage in (b"\xc1\xc1garbage", b"\x92\x01"):
        with pytest.raises(RemoteBadRequestError):
            await client.call(f"{ps.url}/update", encoded=garbage)
    # NaN gradients are skipped and counted, not applied
    nan = np.full((10, 4), np.nan, np.float32)
    result = await client.call(
        f"{ps.url}/update", {"groups": [{"dim": 4, "ids": ids, "grads": nan}]}
    )
    assert result["skipped_nonfinite"] == 10 and result["applied"] == 0
    after = (
        await client.call(f"{ps.url}/lookup", {"train": False, "groups": [{"dim": 4, "ids": ids}]})
    )["groups"][0]
    np.testing.assert_array_equal(before, after)
    stats = await client.call(f"{ps.url}/stats")
    assert stats["entries"] == 10 and stats["optimizer"]["type"] == "sgd"
    assert ps.health()[0] == 200


def _metric(text: str, name: str) -> float:
    """One sample of a /metrics text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def test_a_lookup_applies_the_updates_it_carries_first_in_one_request(ps, client):
    """The embedding worker's carried gradients: applied in order, as /update applies them,
    then the lookup reads; the answer says what each did; no /update request is made."""
    await ready(client, ps.url)  # SGD, lr 0.5
    ids = np.arange(1, 9, dtype=np.uint64)
    groups = [{"dim": 4, "ids": ids}]
    before = (await client.call(f"{ps.url}/lookup", {"train": True, "groups": groups}))["groups"]
    grads = np.full((8, 4), 0.1, np.float32)
    update = {"groups": [{"dim": 4, "ids": ids, "grads": grads}]}
    answer = await client.call(
        f"{ps.url}/lookup",
        {"train": True, "groups": groups, "updates": [update, {"groups": []}, update]},
    )
    np.testing.assert_allclose(answer["groups"][0], before[0] - 2 * 0.5 * grads, rtol=1e-6)
    done = {"applied": 8, "skipped_unknown": 0, "skipped_nonfinite": 0}
    assert answer["applied"] == [done, {**done, "applied": 0}, done]
    stats = await client.call(f"{ps.url}/stats")
    assert stats["updates_applied"] == 16
    text = await (await client._get_session().get(f"{ps.url}/metrics")).text()
    assert _metric(text, 'pyrsia_ps_ids_total{op="update"}') == 16
    assert _metric(text, 'pyrsia_ps_request_seconds_count{op="update"}') == 0


async def test_oversized_body_is_413_and_unknown_route_404(ps, client):
    await ready(client, ps.url)
    big = np.zeros(2 << 20, np.uint8)
    from pyrsia.shared.errors import NotFoundError, PayloadTooLargeError

    with pytest.raises(PayloadTooLargeError) as err:
        await client.call(f"{ps.url}/lookup", {"train": False, "groups": [{"dim": 1, "ids": big}]})
    # the msgpack error body names the cap, so the sender knows how far to shrink
    assert err.value.body["error"] == "too_large"
    assert err.value.limit == err.value.body["limit"] > 0
    assert str(err.value.limit) in err.value.body["message"]
    with pytest.raises(NotFoundError):
        await client.call(f"{ps.url}/no_such_route", {})
    assert ps.health()[0] == 200


async def test_server_side_optimizer_arguments_are_honoured(ps, client):
    spec = {
        "type": "adagrad",
        "lr": 0.2,
        "initial_accumulator_value": 0.5,
        "weight_decay": 0.01,
        "g_square_momentum": 0.9,
        "eps": 1e-6,
        "vectorwise_shared": True,
    }
    await ready(client, ps.url, optimizer=spec)
    stats = await client.call(f"{ps.url}/stats")
    assert stats["optimizer"] == spec
    sgd = {"type": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.001}
    from pyrsia.shared.errors import ConflictError

    ids = np.arange(3, dtype=np.uint64)
    await client.call(f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 2, "ids": ids}]})
    with pytest.raises(ConflictError):  # another optimizer while entries exist
        await client.call(f"{ps.url}/register_optimizer", {"optimizer": sgd})
    await client.call(f"{ps.url}/clear", {})
    await client.call(f"{ps.url}/register_optimizer", {"optimizer": sgd})
    assert (await client.call(f"{ps.url}/stats"))["optimizer"] == sgd


async def test_sigterm_drains_deregisters_and_exits_zero(ps, registry_settings):
    reg = Registry(registry_settings)
    assert await reg.discover(ROLE_EMBEDDING_PS)
    assert ps.stop() == 0
    assert await reg.discover(ROLE_EMBEDDING_PS) == {}
    await reg.close()


async def test_incremental_packets_are_written_and_flushed_on_shutdown(services, tmp_path, client):
    inc = tmp_path / "incremental"
    glob = tmp_path / "global.yml"
    glob.write_text(
        "embedding_parameter_server_config:\n"
        f"  capacity: 1000\n  enable_incremental_update: true\n  incremental_buffer_size: 4\n"
        f"  incremental_dir: {inc}\n"
    )
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--global-config", str(glob)],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
    )
    await ready(client, ps.url)
    ids = np.arange(6, dtype=np.uint64)
    await client.call(f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 2, "ids": ids}]})
    grads = np.ones((6, 2), np.float32)
    await client.call(f"{ps.url}/update", {"groups": [{"dim": 2, "ids": ids, "grads": grads}]})
    await client.call(
        f"{ps.url}/update", {"groups": [{"dim": 2, "ids": ids[:1], "grads": grads[:1]}]}
    )
    packets = sorted(p for p in (inc / "replica_0").iterdir() if p.name.startswith("packet_"))
    assert len(packets) == 1  # 6 distinct ids >= 4: one packet; the 7th update is pending
    assert ps.stop() == 0
    packets = sorted(p for p in (inc / "replica_0").iterdir() if p.name.startswith("packet_"))
    assert len(packets) == 2  # flushed at shutdown
    assert all((p / "done").exists() for p in packets)
