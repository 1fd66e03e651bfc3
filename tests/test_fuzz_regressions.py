"""Regression tests for the bugs the route fuzzer (tests/faults/test_fuzz_routes.py) found.

Each test is the smallest request that showed the bug, against real services.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyrsia.shared.http_client import RemoteBadRequestError
from tests.test_embedding_worker_service import (  # noqa: F401 - fixtures
    client,
    configs,
    make_batch,
    setup_training,
    start_cluster,
)


async def test_worker_answers_400_when_the_ps_refuses_a_forwarded_body(
    services,
    configs,  # noqa: F811 - the fixture imported above
    client,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    """Fuzz finding 1: /load of a missing directory through the worker was a 502
    ("upstream_error"): the PS's 400 naming the field became a server error. (The directory
    lies inside the PS's checkpoint roots, so the refusal is the missing checkpoint's.)"""
    _, (w,) = start_cluster(services, configs(), n_ps=1)
    with pytest.raises(RemoteBadRequestError) as info:
        await client.call(f"{w.url}/load", {"dir": str(tmp_path / "nonexistent" / "checkpoint")})
    assert info.value.peer_status == 400  # the worker's own answer (not 502)
    assert info.value.body["field"] == "directory"
    assert "expected" in info.value.body


async def test_refused_gradients_leave_the_batch_awaiting(services, configs, client):  # noqa: F811
    """Fuzz finding 2: a /gradients body refused for a wrong shape had already taken the
    batch out of the awaiting buffer, so the corrected retry got 404 and the update was lost."""
    _, (w,) = start_cluster(services, configs(), n_ps=1)
    await setup_training(client, w.url)
    await client.call(
        f"{w.url}/batch", {"loader": 0, "batch_id": 0, "batch": make_batch().id_part().to_wire()}
    )
    await client.call(f"{w.url}/lookup", {"batch_id": 0, "train": True})
    wrong = {"batch_id": 0, "gradients": [{"name": "user", "data": np.ones((5, 3), np.float32)}]}
    with pytest.raises(RemoteBadRequestError) as info:
        await client.call(f"{w.url}/gradients", wrong)
    assert info.value.body["field"] == "gradients.user"
    unknown_slot = {
        "batch_id": 0,
        "gradients": [{"name": "nope", "data": np.ones((5, 4), np.float32)}],
    }
    with pytest.raises(RemoteBadRequestError):
        await client.call(f"{w.url}/gradients", unknown_slot)
    assert (await client.call(f"{w.url}/stats"))["awaiting_gradients"] == 1
    right = {"batch_id": 0, "gradients": [{"name": "user", "data": np.ones((5, 4), np.float32)}]}
    result = await client.call(f"{w.url}/gradients", right)
    assert result["applied"] > 0
    assert (await client.call(f"{w.url}/stats"))["awaiting_gradients"] == 0


@pytest.fixture
def ps(services):
    from pyrsia.shared.constants import ROLE_EMBEDDING_PS

    return services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )


async def _ready_ps(client, url):  # noqa: F811
    hyper = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0}
    await client.call(f"{url}/configure", {"hyperparams": hyper})
    await client.call(f"{url}/register_optimizer", {"optimizer": {"type": "sgd", "lr": 0.1}})
    ids = np.arange(10, dtype=np.uint64)
    await client.call(f"{url}/lookup", {"train": True, "groups": [{"dim": 4, "ids": ids}]})


@pytest.mark.parametrize("directory", ["/etc/hostname", "/etc/hostname/sub", "/proc/1/x", "a\x00b"])
async def test_unusable_checkpoint_directory_is_400_naming_dir(ps, client, directory):  # noqa: F811
    """Fuzz finding 3: /dump into a path that cannot be a directory was a 500 (and a 502
    through the worker); it is the caller's input, so a 400 naming ``dir``."""
    await _ready_ps(client, ps.url)
    with pytest.raises(RemoteBadRequestError) as info:
        await client.call(f"{ps.url}/dump", {"dir": directory})
    assert info.value.body["field"] == "dir"
    assert ps.health()[0] == 200


async def test_lookup_whose_answer_is_over_the_message_cap_is_refused(ps, client):  # noqa: F811
    """Fuzz finding 4: a small request (ids) could ask for a huge answer (ids x dim floats,
    dim up to 65536): 2**20 ids at dim 65536 is 256 GiB. It is refused before allocating."""
    await _ready_ps(client, ps.url)
    ids = np.arange(1 << 20, dtype=np.uint64)
    with pytest.raises(RemoteBadRequestError) as info:
        await client.call(
            f"{ps.url}/lookup", {"train": False, "groups": [{"dim": 1 << 16, "ids": ids}]}
        )
    assert info.value.body["field"] == "groups"
    assert ps.health()[0] == 200


async def test_routes_without_parameters_refuse_a_body(ps, client):  # noqa: F811
    """Fuzz finding 5: /clear ran on any body (a stray msgpack 5 emptied the PS)."""
    await _ready_ps(client, ps.url)
    for path in ("/clear", "/stats", "/checksum"):
        for junk in (5, [1], {"all": True}, "x"):
            with pytest.raises(RemoteBadRequestError):
                await client.call(f"{ps.url}{path}", junk)
    assert (await client.call(f"{ps.url}/stats"))["entries"] == 10
    assert (await client.call(f"{ps.url}/clear", {}))["entries"] == 0
