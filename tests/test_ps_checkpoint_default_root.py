"""A PS started with no ``--checkpoint-root`` and no ``$PERSIA_CHECKPOINT_ROOT`` still confines
/dump and /load: to its working directory and the job's ``checkpointing_config.checkpoint_dir``.
Anything else is refused (400 naming ``dir``, the path and the roots) and nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pyrsia.services.embedding_ps.checkpoint_root import checkpoint_roots, confine
from pyrsia.shared.constants import ENV_CHECKPOINT_ROOT, ROLE_EMBEDDING_PS
from pyrsia.shared.errors import InvalidInputError, RemoteBadRequestError, UsageError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.settings import Settings

HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
IDS = np.arange(1, 101, dtype=np.uint64)


@pytest.fixture
async def client():
    c = HttpClient(retries=0)
    yield c
    await c.close()


def test_the_default_roots_are_the_working_directory_and_the_jobs_checkpoint_dir(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cwd = Path(os.path.realpath(tmp_path))
    unset = Settings.from_env({})
    assert checkpoint_roots(None, unset) == (cwd,)
    assert checkpoint_roots(None, unset, "/data/ckpt") == (cwd, Path("/data/ckpt"))
    assert checkpoint_roots(None, unset, "periodic") == (cwd,)  # under the working directory
    empty = Settings.from_env({ENV_CHECKPOINT_ROOT: ""})  # as .honcho.env lists it: the default
    assert checkpoint_roots(None, empty) == (cwd,)
    (tmp_path / "r").mkdir()
    one = Settings.from_env({ENV_CHECKPOINT_ROOT: str(tmp_path / "r")})  # set: only that one
    assert checkpoint_roots(None, one, "/data/ckpt") == (cwd / "r",)
    assert checkpoint_roots("/", one) == (Path("/"),)  # the explicit way to allow any path
    with pytest.raises(UsageError, match="--checkpoint-root"):
        checkpoint_roots(str(tmp_path / "missing"), unset)


def test_a_path_outside_every_root_is_refused_naming_the_path_and_the_roots(tmp_path):
    roots = (tmp_path / "work", tmp_path / "ckpt")
    assert confine(str(tmp_path / "ckpt" / "step_1"), roots) == str(tmp_path / "ckpt" / "step_1")
    with pytest.raises(InvalidInputError) as err:
        confine("/etc/cron.d", roots)
    assert err.value.field == "dir"
    for text in ("/etc/cron.d", str(roots[0]), str(roots[1]), "--checkpoint-root"):
        assert text in err.value.expected
    assert confine("/etc/cron.d", (Path("/"),)) == "/etc/cron.d"


async def test_a_ps_with_default_settings_writes_only_under_its_working_directory(
    services, client, tmp_path, monkeypatch
):
    monkeypatch.delenv(ENV_CHECKPOINT_ROOT, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    periodic = tmp_path / "periodic"
    config = tmp_path / "global.yml"
    config.write_text(f"common_config:\n  checkpointing_config:\n    checkpoint_dir: {periodic}\n")
    ps = services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--global-config", str(config)],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
        cwd=work,
    )
    await client.call(f"{ps.url}/configure", {"hyperparams": HYPER})
    await client.call(f"{ps.url}/register_optimizer", {"optimizer": {"type": "sgd", "lr": 0.5}})
    await client.call(f"{ps.url}/lookup", {"train": True, "groups": [{"dim": 4, "ids": IDS}]})
    before = await client.call(f"{ps.url}/checksum")
    outside = tmp_path / "elsewhere"
    for route in ("/dump", "/load"):
        with pytest.raises(RemoteBadRequestError) as err:
            await client.call(f"{ps.url}{route}", {"dir": str(outside)})
        assert err.value.field == "dir"
        assert str(outside) in err.value.expected and str(work.resolve()) in err.value.expected
    assert not outside.exists()
    await client.call(f"{ps.url}/dump", {"dir": "ckpt"})  # relative: under the working directory
    assert (work / "ckpt" / "replica_0.manifest.json").is_file()
    await client.call(f"{ps.url}/dump", {"dir": str(periodic / "step_1" / "embedding")})
    assert (await client.call(f"{ps.url}/load", {"dir": "ckpt"}))["entries"] == len(IDS)
    assert await client.call(f"{ps.url}/checksum") == before
