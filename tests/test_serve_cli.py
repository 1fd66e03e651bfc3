"""persia-launcher serve and Infer PS flags: unusable input is one line on stderr and exit code 2
(run in this process: every case fails before anything is served)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from persia import launcher
from persia.serving import export_model
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import SGDSpec
from tests.nn_helpers import EMBEDDING_CONFIG, SmallModel
from tests.service_procs import REPO


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run(capsys):
    """``persia-launcher <args>`` in this process (every case here fails before serving)."""

    def go(*args: str) -> Result:
        code = launcher.main(list(args))
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return go


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "embedding_config.yml").write_text(EMBEDDING_CONFIG)
    store = EmbeddingStore(1000, optimizer=SGDSpec(lr=0.1))
    store.lookup(np.arange(1, 9, dtype=np.uint64), 4, train=True)
    store.dump(root / "ckpt", 0, 1)
    g = np.random.default_rng(0)
    examples = (
        [g.normal(size=(3, 2)).astype(np.float32)],
        [g.normal(size=(3, 4)).astype(np.float32), g.normal(size=(3, 2, 4)).astype(np.float32)],
    )
    import torch

    examples = tuple([torch.from_numpy(a) for a in part] for part in examples)
    return export_model(
        root / "model",
        SmallModel(),
        example_inputs=examples,
        embedding_config=root / "embedding_config.yml",
        embedding_checkpoint_dir=root / "ckpt",
    )


def test_serve_is_a_launcher_command():
    out = subprocess.run(
        [sys.executable, "-m", "persia.launcher", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "serve" in out.stdout


def test_missing_model_directory(run, tmp_path):
    out = run("serve", "--model", str(tmp_path / "nothing"))
    assert out.returncode == 2 and "export_dir" in out.stderr and out.stderr.count("\n") == 1


def test_embedding_config_that_differs_from_the_models(run, model_dir, tmp_path):
    other = tmp_path / "emb.yml"
    other.write_text(EMBEDDING_CONFIG.replace("dim: 4", "dim: 5"))
    out = run("serve", "--model", str(model_dir), "--embedding-config", str(other))
    assert out.returncode == 2 and "not the embedding config" in out.stderr


@pytest.mark.parametrize(
    "flag, value",
    [("--max-batch-size", "0"), ("--threads", "0"), ("--port", "70000"), ("--wait-timeout", "0")],
)
def test_bad_numbers(run, model_dir, flag, value):
    out = run("serve", "--model", str(model_dir), flag, value)
    assert out.returncode == 2 and flag in out.stderr


def test_tampered_signature(run, model_dir, tmp_path):
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    text = (
        (copy / "signature.json").read_text().replace('"format_version": 1', '"format_version": 9')
    )
    (copy / "signature.json").write_text(text)
    out = run("serve", "--model", str(copy))
    assert out.returncode == 2 and "signature.json: format_version" in out.stderr


def _ps(run, tmp_path, servers: str, *flags: str) -> Result:
    cfg = tmp_path / "infer.yml"
    cfg.write_text(f"common_config:\n  job_type: Infer\n  infer_config:\n    servers: {servers}\n")
    return run("embedding-parameter-server", "--global-config", str(cfg), *flags)


def test_infer_ps_replica_count_must_match_servers(run, tmp_path):
    out = _ps(run, tmp_path, "[127.0.0.1:7001, 127.0.0.1:7002]", "--port", "7001")
    assert out.returncode == 2 and "lists 2 PS address(es) but --replica-size is 1" in out.stderr


def test_infer_ps_port_must_match_its_server_entry(run, tmp_path):
    out = _ps(run, tmp_path, "[127.0.0.1:7001]", "--port", "7002")
    assert (
        out.returncode == 2
        and "infer_config.servers[0]" in out.stderr
        and "--port is 7002" in out.stderr
    )


def test_scan_interval_is_validated(run, tmp_path):
    cfg = tmp_path / "g.yml"
    cfg.write_text("embedding_parameter_server_config:\n  incremental_scan_interval_seconds: 0\n")
    out = run("embedding-parameter-server", "--global-config", str(cfg))
    assert out.returncode == 2
    assert "embedding_parameter_server_config.incremental_scan_interval_seconds" in out.stderr


@pytest.fixture
def no_token(monkeypatch):
    monkeypatch.delenv("PERSIA_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("PERSIA_INSECURE", raising=False)
    monkeypatch.delenv("PYRSIA_MAX_MESSAGE_BYTES", raising=False)
    return monkeypatch


def test_serve_refuses_a_non_loopback_bind_without_a_token(run, model_dir, no_token):
    out = run("serve", "--model", str(model_dir), "--host", "0.0.0.0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "refusing to listen on 0.0.0.0 without PERSIA_AUTH_TOKEN" in out.stderr
    assert "--insecure" in out.stderr


@pytest.mark.parametrize("how", ["--insecure", "PERSIA_INSECURE", "PERSIA_AUTH_TOKEN"])
def test_serve_binds_non_loopback_with_a_token_or_insecure(run, model_dir, no_token, tmp_path, how):
    """Past the bind rule, the next check speaks: a mismatching embedding config (so the
    command stops before it would serve)."""
    flags = []
    if how == "--insecure":
        flags.append("--insecure")
    elif how == "PERSIA_INSECURE":
        no_token.setenv("PERSIA_INSECURE", "1")
    else:
        no_token.setenv("PERSIA_AUTH_TOKEN", "t" * 32)
    other = tmp_path / "emb.yml"
    other.write_text(EMBEDDING_CONFIG.replace("dim: 4", "dim: 5"))
    out = run(
        "serve",
        "--model",
        str(model_dir),
        "--host",
        "0.0.0.0",
        "--embedding-config",
        str(other),
        *flags,
    )
    assert out.returncode == 2 and "not the embedding config" in out.stderr, out.stderr


def test_serve_checks_the_token_and_the_size_cap(run, model_dir, no_token):
    no_token.setenv("PERSIA_AUTH_TOKEN", "short")
    out = run("serve", "--model", str(model_dir))
    assert out.returncode == 2 and "PERSIA_AUTH_TOKEN: expected at least" in out.stderr
    no_token.delenv("PERSIA_AUTH_TOKEN")
    out = run("serve", "--model", str(model_dir), "--max-request-bytes", "0")
    assert out.returncode == 2 and "--max-request-bytes must be a positive" in out.stderr
