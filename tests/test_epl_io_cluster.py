"""EPL's io.* (file slicing for data loaders) and cluster.* keys."""

from __future__ import annotations

import logging
import os

import pytest

import persia.epl as epl
from persia.epl import cluster, state
from persia.epl.config import Config
from pyrsia.shared.errors import ConfigError, InvalidInputError

FILES = [f"part-{i}.csv" for i in range(7)]


@pytest.fixture(autouse=True)
def _fresh_state():
    state.reset()
    cluster._logged.clear()
    yield
    state.reset()


def _slices(config_dict):
    config = Config(config_dict, environ={})
    return [epl.slice_files(FILES, i, 3, config) for i in range(3)]


def test_no_slicing_every_loader_reads_every_file():
    assert _slices({}) == [FILES, FILES, FILES]


def test_slicing_seven_files_over_three_loaders_needs_a_policy():
    with pytest.raises(ConfigError, match="do not divide evenly over 3 data loaders"):
        _slices({"io.slicing": True})


def test_drop_last_files_gives_each_loader_two():
    slices = _slices({"io.slicing": True, "io.drop_last_files": True})
    assert slices == [
        ["part-0.csv", "part-3.csv"],
        ["part-1.csv", "part-4.csv"],
        ["part-2.csv", "part-5.csv"],
    ]


def test_unbalanced_slicing_gives_three_two_two_covering_all():
    slices = _slices({"io.slicing": True, "io.unbalanced_io_slicing": True})
    assert [len(s) for s in slices] == [3, 2, 2]
    assert sorted(f for s in slices for f in s) == FILES


def test_drop_last_files_wins_over_unbalanced():
    both = _slices(
        {"io.slicing": True, "io.drop_last_files": True, "io.unbalanced_io_slicing": True}
    )
    assert [len(s) for s in both] == [2, 2, 2]


def test_balanced_slicing_when_files_divide_evenly():
    config = Config({"io.slicing": True}, environ={})
    assert [epl.slice_files(FILES[:6], i, 3, config) for i in range(3)] == [
        ["part-0.csv", "part-3.csv"],
        ["part-1.csv", "part-4.csv"],
        ["part-2.csv", "part-5.csv"],
    ]
    with pytest.raises(ConfigError, match="at least one file"):
        epl.slice_files(FILES[:2], 0, 3, config)


def test_slice_files_reads_replica_env_and_init_config(monkeypatch):
    from persia import env

    monkeypatch.setenv("REPLICA_INDEX", "1")
    monkeypatch.setenv("REPLICA_SIZE", "3")
    env.reload_env()
    try:
        epl.init(Config({"io.slicing": True, "io.unbalanced_io_slicing": True}, environ={}))
        dataset = epl.FileListDataset(FILES, lambda path: [path.upper()])
        assert list(dataset) == ["PART-1.CSV", "PART-4.CSV"] and len(dataset) == 2
    finally:
        monkeypatch.delenv("REPLICA_INDEX")
        monkeypatch.delenv("REPLICA_SIZE")
        env.reload_env()


def test_slice_files_validates_arguments():
    with pytest.raises(InvalidInputError, match="replica_index"):
        epl.slice_files(FILES, 3, 3, Config(environ={}))
    with pytest.raises(InvalidInputError, match="files"):
        epl.slice_files("part-0.csv", 0, 1, Config(environ={}))


def test_run_visible_devices_sets_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    epl.init(Config({"cluster.run_visible_devices": "1,0"}, environ={}))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"


def test_placement_keys_are_logged_once_as_no_effect(caplog):
    config = Config(
        {
            "cluster.device_place_prefer_intra_node": False,
            "cluster.colocate_split_and_replicate": True,
        },
        environ={},
    )
    with caplog.at_level(logging.WARNING, logger="persia.epl.cluster"):
        epl.init(config)
        epl.init(config)
    assert caplog.text.count("has no effect in Pyrsia") == 2  # two keys, each once
    assert "cluster.device_place_prefer_intra_node=False" in caplog.text
    assert "cluster.colocate_split_and_replicate=True" in caplog.text


def test_default_cluster_keys_log_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="persia.epl.cluster"):
        assert cluster.apply_cluster_config(Config(environ={})) == []
    assert caplog.text == ""
