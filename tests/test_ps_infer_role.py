"""An Infer PS serves reads only: every route that would change what it serves is refused with
409 naming its role, and the store stays bit-identical; loading its served checkpoint, eval
lookups, /configure (whose settings only train lookups and updates use), /dump, /stats and
/checksum keep working."""

from __future__ import annotations

import numpy as np
import pytest

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.embedding_spec import AdagradSpec
from pyrsia.shared.errors import ConflictError
from pyrsia.shared.http_client import HttpClient

HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
IDS = np.arange(1, 301, dtype=np.uint64)


@pytest.fixture
async def client():
    c = HttpClient(retries=0)
    yield c
    await c.close()


@pytest.fixture
def infer_ps(services, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    trained = EmbeddingStore(10_000, optimizer=AdagradSpec(lr=0.1))
    trained.lookup(IDS, 8, train=True)
    trained.update(IDS, np.ones((IDS.shape[0], 8), np.float32))
    trained.dump(root / "ckpt", 0, 1)
    config = tmp_path / "infer.yml"
    config.write_text("common_config:\n  job_type: Infer\n")
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--global-config", str(config), "--checkpoint-root", str(root)],
        role=ROLE_EMBEDDING_PS,
    )
    return ps, root


REFUSED = [
    ("/clear", {}),
    ("/register_optimizer", {"optimizer": {"type": "sgd", "lr": 0.5}}),
    (
        "/lookup",
        {"train": True, "groups": [{"dim": 8, "ids": np.arange(1000, 1100, dtype=np.uint64)}]},
    ),
    (
        "/update",
        {"groups": [{"dim": 8, "ids": IDS, "grads": np.ones((len(IDS), 8), np.float32)}]},
    ),
]


async def test_an_infer_ps_refuses_every_route_that_changes_what_it_serves(infer_ps, client):
    ps, root = infer_ps
    assert (await client.call(f"{ps.url}/load", {"dir": str(root / "ckpt")}))["entries"] == len(IDS)
    served = await client.call(f"{ps.url}/checksum")
    assert served["entries"] == len(IDS)
    for route, body in REFUSED:
        with pytest.raises(ConflictError) as err:
            await client.call(f"{ps.url}{route}", body)
        assert err.value.peer_status == 409, route
        assert f"{route} refused" in str(err.value) and "job_type Infer" in str(err.value), route
        assert await client.call(f"{ps.url}/checksum") == served, route
    carrying = {  # an eval lookup carrying gradients: refused as /update is
        "train": False,
        "groups": [{"dim": 8, "ids": IDS}],
        "updates": [
            {"groups": [{"dim": 8, "ids": IDS, "grads": np.ones((len(IDS), 8), np.float32)}]}
        ],
    }
    with pytest.raises(ConflictError) as err:
        await client.call(f"{ps.url}/lookup", carrying)
    assert err.value.peer_status == 409 and "/update refused" in str(err.value)
    assert await client.call(f"{ps.url}/checksum") == served
    # what it serves with keeps working
    eval_lookup = {"train": False, "groups": [{"dim": 8, "ids": IDS}]}
    got = (await client.call(f"{ps.url}/lookup", eval_lookup))["groups"][0]
    assert got.shape == (len(IDS), 8) and np.all(got != 0)
    await client.call(f"{ps.url}/configure", {"hyperparams": HYPER})
    await client.call(f"{ps.url}/dump", {"dir": str(root / "copy")})
    assert (await client.call(f"{ps.url}/load", {"dir": str(root / "copy")}))["entries"] == len(IDS)
    assert await client.call(f"{ps.url}/checksum") == served
    assert (await client.call(f"{ps.url}/stats"))["updates_applied"] == 0
    assert ps.health()[0] == 200
