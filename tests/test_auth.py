"""PERSIA_AUTH_TOKEN and the bind rule: 401 without the token on every route, clients send
it, servers refuse a non-loopback address without a token unless --insecure."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest
import torch

from persia.ctx import DataCtx
from persia.data import DataLoader, StreamingDataset
from pyrsia.shared.auth import check_bind, check_token, is_authorized, is_loopback
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.errors import AuthError, ConfigError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.runtime import shutdown_runtime
from pyrsia.shared.settings import Settings
from tests.nn_helpers import SmallModel, environ, job_services, make_batch, small_train_ctx
from tests.service_procs import REPO

TOKEN = "t0ken-" + "x" * 26
PS_ROUTES = [
    "/configure",
    "/register_optimizer",
    "/lookup",
    "/update",
    "/dump",
    "/load",
    "/clear",
    "/stats",
    "/checksum",
]


def test_token_must_be_long_visible_ascii():
    assert check_token(TOKEN) == TOKEN
    for bad in ("short", "x" * 15, "has a space in it!!", "tab\there-xxxxxxxxxx", "é" * 20):
        with pytest.raises(ConfigError, match="PERSIA_AUTH_TOKEN"):
            check_token(bad)


def test_header_check_is_exact():
    assert is_authorized(f"Bearer {TOKEN}", TOKEN)
    for header in (None, "", TOKEN, f"Bearer {TOKEN}x", f"bearer {TOKEN}", f"Bearer {TOKEN[:-1]}"):
        assert not is_authorized(header, TOKEN), header
    assert not is_authorized("Bearer \udcff", TOKEN)  # undecodable bytes are just wrong


def test_loopback_rule():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("::")
    assert not is_loopback("10.1.2.3")
    check_bind("127.0.0.1", token=None, insecure=False)
    check_bind("0.0.0.0", token=TOKEN, insecure=False)
    check_bind("0.0.0.0", token=None, insecure=True)
    with pytest.raises(ConfigError, match="--insecure"):
        check_bind("0.0.0.0", token=None, insecure=False)


@pytest.mark.parametrize(
    "module", ["pyrsia.services.embedding_ps", "pyrsia.services.embedding_worker"]
)
def test_server_refuses_public_bind_without_token_in_one_line(module, tmp_path):
    config = tmp_path / "e.yml"
    config.write_text("slots_config:\n  a:\n    dim: 2\n")
    env = {"PATH": "/usr/bin:/bin", "PERSIA_REDIS_URL": "redis://127.0.0.1:1/0"}
    proc = subprocess.run(
        [sys.executable, "-m", module, "--host", "0.0.0.0", "--embedding-config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "PERSIA_AUTH_TOKEN" in lines[0] and "--insecure" in lines[0], lines
    bad_token = subprocess.run(
        [sys.executable, "-m", module, "--embedding-config", str(config)],
        cwd=REPO,
        env={**env, "PERSIA_AUTH_TOKEN": "short"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad_token.returncode == 2 and "PERSIA_AUTH_TOKEN" in bad_token.stderr


def test_max_request_bytes_flag_is_validated(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pyrsia.services.embedding_ps", "--max-request-bytes", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--max-request-bytes" in proc.stderr


@pytest.fixture
def token_ps(services, monkeypatch):
    monkeypatch.setenv("PERSIA_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("PERSIA_ADVERTISE_HOST", "127.0.0.1")
    return services(
        "pyrsia.services.embedding_ps",
        ["--port", "0", "--host", "0.0.0.0", "--max-request-bytes", "4096"],
        role=ROLE_EMBEDDING_PS,
        wait_ready=False,
    )


async def test_every_route_needs_the_token(token_ps):
    anonymous = HttpClient(retries=0, auth_token=None)
    wrong = HttpClient(retries=0, auth_token="w" * 32)
    right = HttpClient(retries=0, auth_token=TOKEN)
    try:
        for client in (anonymous, wrong):
            for path in [*PS_ROUTES, "/health", "/metrics"]:
                method = "GET" if path in ("/health", "/metrics") else "POST"
                with pytest.raises(AuthError) as info:
                    await client.call(f"{token_ps.url}{path}", {}, method=method)
                assert info.value.status == 401 and info.value.body["error"] == "unauthorized"
        await right.call(
            f"{token_ps.url}/configure",
            {"hyperparams": {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0}},
        )
        await right.call(
            f"{token_ps.url}/register_optimizer", {"optimizer": {"type": "sgd", "lr": 1}}
        )
        assert (await right.call(f"{token_ps.url}/checksum"))["entries"] == 0
        assert (await right.call(f"{token_ps.url}/health", method="GET"))["ready"]
        # the size cap from --max-request-bytes (a 413 without the token is still a 401)
        big = {"train": False, "groups": [{"dim": 1, "ids": np.zeros(1024, np.uint64)}]}
        from pyrsia.shared.errors import PayloadTooLargeError

        with pytest.raises(PayloadTooLargeError):
            await right.call(f"{token_ps.url}/lookup", big)
        with pytest.raises(AuthError):
            await anonymous.call(f"{token_ps.url}/lookup", big)
    finally:
        for client in (anonymous, wrong, right):
            await client.close()
    assert token_ps.health()[0] == 200


def test_a_whole_job_runs_with_a_token(redis_server, tmp_path):
    """Services, data loader (DataCtx) and NN worker (TrainCtx + ingress) all send the token."""
    env = {
        "PERSIA_REDIS_URL": redis_server.url,
        "PERSIA_JOB_ID": f"auth-{uuid.uuid4().hex[:8]}",
        "PERSIA_AUTH_TOKEN": TOKEN,
    }
    n_batches = 4
    errors: list[BaseException] = []

    def data_loader() -> None:
        try:
            with DataCtx() as ctx:
                for k in range(n_batches):
                    ctx.send_data(make_batch([7000 + k, 7001 + k], seed=k))
        except BaseException as exc:  # reported below
            errors.append(exc)

    shutdown_runtime()  # the process's HTTP client reads the token when it is made
    try:
        with environ(**env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"), job_services(env, tmp_path):
            from persia import env as persia_env

            persia_env.reload_env()
            model = SmallModel()
            seen = []
            feeder = threading.Thread(target=data_loader)
            with small_train_ctx(model) as ctx:
                feeder.start()
                for batch in DataLoader(StreamingDataset(buffer_size=2), timeout_ms=90000):
                    output, labels = ctx.forward(batch)
                    ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
                    seen.append(batch.batch_id)
            feeder.join()
        persia_env.reload_env()
    finally:
        shutdown_runtime()
    assert not errors, errors
    assert sorted(seen) == list(range(n_batches))


async def test_ingress_refuses_public_bind_without_token(registry_settings):
    from dataclasses import replace

    from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress

    for insecure, refusal in (("0", "--insecure"), ("maybe", "PERSIA_INSECURE")):
        environment = Settings.from_env({"PERSIA_INSECURE": insecure})
        ingress = Ingress(
            BatchQueue(1, rank=0, world_size=1),
            registry_settings=replace(registry_settings, environment=environment),
            host="0.0.0.0",
        )
        with pytest.raises(ConfigError, match=refusal):
            await ingress.start()


def test_nn_worker_launcher_checks_the_bind_rule_once(tmp_path, monkeypatch, capsys):
    from pyrsia.services.nn_worker.launch import main

    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.delenv("PERSIA_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("PERSIA_INSECURE", raising=False)
    monkeypatch.setenv("PERSIA_BIND_HOST", "0.0.0.0")
    assert main([str(script)]) == 2
    assert "--insecure" in capsys.readouterr().err


def test_the_runtime_sends_the_token_of_its_settings_and_keeps_it_for_the_next():
    """The process runtime's client sends PERSIA_AUTH_TOKEN of the settings it was made with;
    one made again (after a stop, or in a forked child) without settings keeps that token."""
    from aiohttp import web

    from pyrsia.shared.http_server import make_app, msgpack_handler
    from pyrsia.shared.runtime import get_runtime

    async def echo(request: web.Request, body: object) -> object:
        return body

    async def serve() -> tuple[web.AppRunner, str]:
        app = make_app("peer", auth_token=TOKEN, settings=Settings.from_env({}))
        app.router.add_post("/echo", msgpack_handler(echo))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner, f"http://127.0.0.1:{port}/echo"

    def call(runtime) -> object:
        runner, url = runtime.run(serve())
        try:
            return runtime.run(runtime.client.call(url, {"a": 1}))
        finally:
            runtime.run(runner.cleanup())

    shutdown_runtime()
    try:
        assert call(get_runtime(Settings.from_env({"PERSIA_AUTH_TOKEN": TOKEN}))) == {"a": 1}
        shutdown_runtime()
        assert call(get_runtime()) == {"a": 1}  # the token kept
        shutdown_runtime()
        with pytest.raises(AuthError):
            call(get_runtime(Settings.from_env({})))  # settings without a token: none sent
    finally:
        shutdown_runtime()
