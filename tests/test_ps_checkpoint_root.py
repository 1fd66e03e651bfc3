"""A real PS with ``--checkpoint-root``: /dump and /load paths outside it are refused (400
naming ``dir`` and the root; symlinks and ``..`` resolved) and nothing stored changes; an
Infer PS refuses /update with 409 and says why."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pyrsia.shared.constants import ENV_CHECKPOINT_ROOT, ROLE_EMBEDDING_PS
from pyrsia.shared.errors import ConflictError, RemoteBadRequestError
from pyrsia.shared.http_client import HttpClient

HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
IDS = np.arange(1, 201, dtype=np.uint64)


@pytest.fixture
async def client():
    c = HttpClient(retries=0)
    yield c
    await c.close()


@pytest.fixture
def root(tmp_path):
    (tmp_path / "root").mkdir()
    return (tmp_path / "root").resolve()


async def _filled(ps, client) -> dict:
    await client.call(f"{ps.url}/configure", {"hyperparams": HYPER})
    await client.call(f"{ps.url}/register_optimizer", {"optimizer": {"type": "sgd", "lr": 0.5}})
    await client.call(f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 4, "ids": IDS}]})
    return await client.call(f"{ps.url}/checksum")


async def test_paths_outside_the_root_are_refused_and_nothing_changes(
    services, client, root, tmp_path
):
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--checkpoint-root", str(root)],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
    )
    before = await _filled(ps, client)
    await client.call(f"{ps.url}/dump", {"dir": str(root / "ckpt")})  # inside: fine
    outside = tmp_path / "outside"
    (root / "link").symlink_to(tmp_path)  # inside by name, outside once resolved
    refused = [
        str(outside),
        str(root / ".." / "outside"),
        str(root / "link" / "outside"),
        "/",
        "relative/dir",  # resolved against the PS's working directory, which is not the root
    ]
    for path in refused:
        for route in ("/dump", "/load"):
            with pytest.raises(RemoteBadRequestError) as err:
                await client.call(f"{ps.url}{route}", {"dir": path})
            assert err.value.field == "dir" and str(root) in err.value.expected, (route, path)
            assert "--checkpoint-root" in err.value.expected
    assert not outside.exists()  # a refused dump created nothing
    # a refused load left the store as it was; a load from inside the root still works
    assert await client.call(f"{ps.url}/checksum") == before
    await client.call(f"{ps.url}/clear", {})
    assert (await client.call(f"{ps.url}/load", {"dir": str(root / "link" / "root" / "ckpt")}))[
        "entries"
    ] == len(IDS)
    assert await client.call(f"{ps.url}/checksum") == before
    assert ps.health()[0] == 200  # the service keeps running


async def test_the_root_comes_from_the_environment_too(
    services, client, root, tmp_path, monkeypatch
):
    monkeypatch.setenv(ENV_CHECKPOINT_ROOT, str(root))
    ps = services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    before = await _filled(ps, client)
    with pytest.raises(RemoteBadRequestError, match="checkpoint root"):
        await client.call(f"{ps.url}/dump", {"dir": str(tmp_path / "elsewhere")})
    await client.call(f"{ps.url}/dump", {"dir": str(root / "a" / "b")})
    assert await client.call(f"{ps.url}/checksum") == before


def test_a_root_that_is_not_a_directory_stops_the_ps(tmp_path, job_env):
    env = dict(os.environ, **{ENV_CHECKPOINT_ROOT: ""})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyrsia.services.embedding_ps",
            "--port",
            "0",
            "--checkpoint-root",
            str(tmp_path / "missing"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--checkpoint-root" in proc.stderr and "not an existing directory" in proc.stderr


async def test_an_infer_ps_refuses_update_with_409_and_says_why(services, client, tmp_path):
    config = tmp_path / "infer.yml"
    config.write_text("common_config:\n  job_type: Infer\n")
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--global-config", str(config)],
        role=ROLE_EMBEDDING_PS,
    )
    lookup = {"train": False, "groups": [{"dim": 4, "ids": IDS}]}
    before = await client.call(f"{ps.url}/checksum")
    body = {"groups": [{"dim": 4, "ids": IDS, "grads": np.ones((len(IDS), 4), np.float32)}]}
    with pytest.raises(ConflictError) as err:
        await client.call(f"{ps.url}/update", body)
    assert err.value.peer_status == 409
    assert "job_type Infer" in str(err.value) and "not 403" in str(err.value)
    assert await client.call(f"{ps.url}/checksum") == before
    await client.call(f"{ps.url}/lookup", lookup)  # eval lookups still served
    assert (await client.call(f"{ps.url}/stats"))["updates_applied"] == 0
