"""persia.env: lazy, cached reads of RANK/LOCAL_RANK/WORLD_SIZE and REPLICA_INDEX/REPLICA_SIZE."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from persia import env
from pyrsia.shared.errors import ConfigError

_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "REPLICA_INDEX", "REPLICA_SIZE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
    env.reload_env()
    yield
    env.reload_env()


def test_defaults_when_nothing_is_set():
    assert (env.get_rank(), env.get_local_rank(), env.get_world_size()) == (None, None, None)
    assert (env.get_replica_index(), env.get_replica_size()) == (0, 1)


def test_reads_torchrun_and_launcher_variables(monkeypatch):
    for name, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("REPLICA_INDEX", "2")
    monkeypatch.setenv("REPLICA_SIZE", "5")
    env.reload_env()
    assert (env.get_rank(), env.get_local_rank(), env.get_world_size()) == (3, 1, 4)
    assert (env.get_replica_index(), env.get_replica_size()) == (2, 5)


def test_values_are_cached_until_reload(monkeypatch):
    assert env.get_replica_index() == 0
    monkeypatch.setenv("REPLICA_INDEX", "1")
    monkeypatch.setenv("REPLICA_SIZE", "2")
    assert env.get_replica_index() == 0  # still the cached value
    env.reload_env()
    assert env.get_replica_index() == 1


def test_empty_variables_count_as_unset(monkeypatch):
    monkeypatch.setenv("RANK", "")
    monkeypatch.setenv("REPLICA_INDEX", " ")
    assert env.get_rank() is None
    assert env.get_replica_index() == 0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"REPLICA_INDEX": "x", "REPLICA_SIZE": "2"},
            "REPLICA_INDEX: expected an integer >= 0, got 'x'",
        ),
        (
            {"REPLICA_INDEX": "-1", "REPLICA_SIZE": "2"},
            "REPLICA_INDEX: expected an integer >= 0, got -1",
        ),
        (
            {"REPLICA_INDEX": "0", "REPLICA_SIZE": "0"},
            "REPLICA_SIZE: expected an integer >= 1, got 0",
        ),
        (
            {"REPLICA_INDEX": "2", "REPLICA_SIZE": "2"},
            "REPLICA_INDEX: expected an integer below REPLICA_SIZE=2, got 2",
        ),
        ({"REPLICA_INDEX": "1"}, "REPLICA_SIZE is not set but REPLICA_INDEX is"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "LOCAL_RANK is not set but RANK, WORLD_SIZE are"),
        (
            {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
            "RANK: expected an integer below WORLD_SIZE=2, got 2",
        ),
        (
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1.5"},
            "WORLD_SIZE: expected an integer >= 1, got '1.5'",
        ),
    ],
)
def test_bad_values_name_the_variable(monkeypatch, values, message):
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        env.get_replica_index()
    assert message in str(info.value)


def test_nothing_is_read_at_import_time():
    # A bad value must not break `import persia.env`; only a getter call reports it.
    code = (
        "import persia.env as e\n"
        "try:\n"
        "    e.get_rank()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"RANK": "oops", "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
        cwd=str(Path(__file__).parent.parent),
    )
    assert out.stdout.strip() == "ConfigError"


# --- PERSIA's own test/test_env.py, ported (its assertions, our fixture) -------------------


def test_persia_data_loader_env(monkeypatch):
    # PERSIA sets lower-case names, which its getters never read: the defaults must come back.
    monkeypatch.setenv("replica_size", "1")
    monkeypatch.setenv("replica_index", "0")
    assert env.get_replica_size() == 1
    assert env.get_replica_index() == 0


def test_persia_nn_worker_env(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert env.get_world_size() == 1
    assert env.get_rank() == 0
    assert env.get_local_rank() == 0


@pytest.mark.parametrize(
    "stray",
    [
        {"LOCAL_RANK": "0"},
        {"WORLD_SIZE": "4"},
        {"LOCAL_RANK": "7", "WORLD_SIZE": "2"},
        {"LOCAL_RANK": "junk", "WORLD_SIZE": "-3"},
    ],
)
def test_without_rank_local_rank_and_world_size_are_ignored(monkeypatch, stray):
    # A data loader launched from a shell that exports torch's variables (or a malformed
    # leftover) is not an NN worker: nothing about ranks is read or validated.
    for name, value in stray.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("REPLICA_INDEX", "1")
    monkeypatch.setenv("REPLICA_SIZE", "3")
    assert (env.get_rank(), env.get_local_rank(), env.get_world_size()) == (None, None, None)
    assert (env.get_replica_index(), env.get_replica_size()) == (1, 3)


def test_rank_set_still_requires_its_companions(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match="WORLD_SIZE is not set but RANK, LOCAL_RANK are"):
        env.get_rank()


def test_persia_test_file_in_one_process_in_its_order():
    # PERSIA's test/test_env.py runs both tests in one process, without resetting anything
    # between them: the NN-worker test leaves RANK set and the values cached.
    code = (
        "import os\n"
        "from persia.env import get_local_rank, get_rank, get_replica_index, get_replica_size, get_world_size\n"
        "os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0')\n"
        "assert (get_world_size(), get_rank(), get_local_rank()) == (1, 0, 0)\n"
        "os.environ.update(replica_size='1', replica_index='0')\n"
        "assert (get_replica_size(), get_replica_index()) == (1, 0)\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": ""},
        capture_output=True,
        text=True,
        cwd=str(Path(__file__).parent.parent),
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
