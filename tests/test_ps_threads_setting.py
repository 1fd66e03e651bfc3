"""The embedding PS's thread setting: ``--threads``, else ``PYRSIA_PS_THREADS``, else the usable
cores; checked and named when wrong; the store gets at least one internal shard per thread,
and exactly one per thread (or as many as its capacity needs) when the job leaves
``num_hashmap_internal_shards`` unset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pyrsia.services.embedding_ps import parallel
from pyrsia.services.embedding_ps.main import make_store, ps_threads
from pyrsia.services.embedding_ps.parallel import MAX_THREADS, usable_cores
from pyrsia.shared.config import EmbeddingParameterServerConfig
from pyrsia.shared.constants import (
    ENV_PS_THREADS,
    MAX_ENTRIES_PER_SHARD,
    PS_PARALLEL_MIN_CORES,
)
from pyrsia.shared.errors import ConfigError, UsageError
from pyrsia.shared.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def _threads(raw: str | None) -> Settings:
    return Settings.from_env({} if raw is None else {ENV_PS_THREADS: raw})


def test_flag_then_environment_then_cores():
    cores = usable_cores()
    expected = 1 if cores < PS_PARALLEL_MIN_CORES else min(cores, MAX_THREADS)
    assert ps_threads(None, _threads(None)) == expected
    assert ps_threads(None, _threads("3")) == 3
    assert ps_threads(5, _threads("3")) == 5


@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5", str(MAX_THREADS + 1)])
def test_a_bad_environment_value_is_a_config_error_naming_the_variable(raw):
    with pytest.raises(ConfigError, match=f"^{ENV_PS_THREADS}: expected"):
        ps_threads(None, _threads(raw))


@pytest.mark.parametrize("flag", [0, -1, MAX_THREADS + 1])
def test_a_bad_flag_is_a_usage_error_naming_the_flag(flag):
    # the flag is checked, not the variable
    with pytest.raises(UsageError, match=r"^--threads: expected an integer in \[1, 64\]"):
        ps_threads(flag, _threads("2"))


@pytest.mark.parametrize(
    "key,threads,shards", [(1, 2, 2), (1, 1, 1), (100, 2, 64), (8, 2, 8), (3, 4, 4)]
)
def test_the_store_has_at_least_one_shard_per_thread(key, threads, shards):
    store = make_store(
        EmbeddingParameterServerConfig(capacity=1000, num_hashmap_internal_shards=key), threads
    )
    assert (store.num_shards, store.threads) == (shards, threads)
    assert store.stats()["num_shards"] == shards
    store.close()


@pytest.mark.parametrize(
    "capacity,threads,shards",
    [
        (1000, 1, 1),
        (1000, 2, 2),
        (1000, 4, 4),
        (MAX_ENTRIES_PER_SHARD, 1, 1),
        (MAX_ENTRIES_PER_SHARD + 1, 1, 2),
    ],
)
def test_an_unset_key_gives_one_shard_per_thread_or_what_the_capacity_needs(
    capacity, threads, shards
):
    """PERSIA's default (100, so 64 shards) cost a one-thread store ~5 us per shard per call."""
    assert EmbeddingParameterServerConfig().num_hashmap_internal_shards is None
    store = make_store(EmbeddingParameterServerConfig(capacity=capacity), threads)
    assert (store.num_shards, store.threads) == (shards, threads)
    store.close()


def test_embedded_mode_store_follows_the_same_rule(tmp_path):
    """Embedded mode's in-process store: one shard per store thread with the key unset,
    the key's count (at most 64) when set."""
    from pyrsia.services.embedded.transport import InProcessTransport
    from pyrsia.shared.config import load_embedding_config, parse_global_config

    (tmp_path / "embedding.yml").write_text("slots_config:\n  a: {dim: 4}\n")
    schema = load_embedding_config(tmp_path / "embedding.yml")
    threads = parallel.resolve_threads(None)
    for key, shards in ((None, threads), (100, max(threads, 64)), (3, max(threads, 3))):
        ps = (
            {"capacity": 1000}
            if key is None
            else {"capacity": 1000, "num_hashmap_internal_shards": key}
        )
        config = parse_global_config({"embedding_parameter_server_config": ps})
        engines = InProcessTransport(schema, config)
        try:
            assert engines.store.num_shards == shards, key
        finally:
            engines.close()


def test_the_service_refuses_a_bad_value_at_start():
    done = subprocess.run(
        [sys.executable, "-m", "persia.launcher", "embedding-parameter-server", "--threads", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--threads: expected an integer in [1, 64], got 0" in done.stderr


@pytest.mark.parametrize(
    ("cores", "threads"), [(1, 1), (2, 1), (3, 1), (4, 4), (16, 16), (200, MAX_THREADS)]
)
def test_a_small_node_defaults_to_one_thread_a_big_one_to_every_core(monkeypatch, cores, threads):
    monkeypatch.setattr(parallel, "usable_cores", lambda: cores)
    assert parallel.default_threads() == threads
    assert parallel.resolve_threads(None) == threads
    assert parallel.resolve_threads(2) == 2
