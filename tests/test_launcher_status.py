"""``persia-launcher status`` against real services: a PS and an embedding worker (processes),
an NN-worker rank's ingress serving its training stats, a launcher slot in the job lease, and
a registered address nobody answers at (persia/_launch/status.py)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import torch

from persia.ctx import TrainCtx
from persia.embedding.optim import SGD
from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.services.nn_worker.rank_stats import RankStats
from pyrsia.shared.constants import (
    ROLE_DATA_LOADER,
    ROLE_EMBEDDING_PS,
    ROLE_EMBEDDING_WORKER,
    ROLE_NN_WORKER,
)
from pyrsia.shared.registry import Registry, ServiceRecord
from tests.nn_helpers import SmallModel
from tests.redis_server import free_port
from tests.service_procs import REPO


async def _status(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "persia.launcher",
        "status",
        *args,
        cwd=REPO,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


def _enter_a_train_ctx() -> None:
    model = SmallModel()
    with TrainCtx(
        SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model, mixed_precision=False
    ):
        pass


def _row(text: str, name: str) -> str:
    lines = [line for line in text.splitlines() if name in line]
    assert lines, f"{name} missing from:\n{text}"
    return lines[0]


async def test_status_lists_every_process_with_its_health(
    services, job_env, registry_settings, tmp_path
):
    (tmp_path / "emb.yml").write_text("slots_config:\n  a:\n    dim: 4\n")
    ps = services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    services(
        "pyrsia.services.embedding_worker",
        ["--port", "0", "--embedding-config", str(tmp_path / "emb.yml")],
        role=ROLE_EMBEDDING_WORKER,
    )
    stats = RankStats(loss_every=1)
    stats.step_done(42, 128, torch.tensor(0.3125), 1.0, True)
    ingress = Ingress(
        BatchQueue(4, rank=0, world_size=2), registry_settings=registry_settings, stats=stats
    )
    await ingress.start()
    registry = Registry(registry_settings)
    dead = f"127.0.0.1:{free_port()}"
    try:
        # an NN rank 1 registered at an address where nothing listens; a data loader's slot
        await registry.register(
            ServiceRecord(role=ROLE_NN_WORKER, replica_index=1, replica_size=2, address=dead, pid=1)
        )
        await registry.lease.claim(ROLE_DATA_LOADER, 0, 1)
        # through a pipe, no --width: the table's own width, each row on one line
        code, out, err = await _status(job_env, "--no-color", "--interval", "0.2")
        assert code == 1, (out, err)  # one server does not answer
        assert max(len(line) for line in out.splitlines()) > 80, out
        assert "\x1b[" not in out  # plain text
        assert job_env["PERSIA_JOB_ID"] in out
        assert "2/4 servers ready" in out, out
        ps_row = _row(out, f"{ROLE_EMBEDDING_PS}/0")  # no TrainCtx configured it yet
        assert ps.address in ps_row and "not ready (not configured" in ps_row, ps_row
        assert "entries 0" in ps_row and "0 ids/s" in ps_row, ps_row
        assert re.search(r"\d+\.\d (MiB|GiB)", ps_row), ps_row  # memory
        assert re.search(r"\d+s", ps_row), ps_row  # uptime
        assert "ready" in _row(out, f"{ROLE_EMBEDDING_WORKER}/0")
        rank0 = _row(out, f"{ROLE_NN_WORKER}/0")
        assert ingress.address in rank0 and "ready" in rank0
        assert "step 42" in rank0 and "loss 0.3125" in rank0
        rank1 = _row(out, f"{ROLE_NN_WORKER}/1")
        assert dead in rank1 and "unreachable" in rank1
        assert "(launcher)" in _row(out, f"{ROLE_DATA_LOADER}/0")
    finally:
        await registry.lease.release(ROLE_DATA_LOADER, 0)
        await registry.close()
        await ingress.stop()
    # a TrainCtx configures the PS and registers its optimizer: every server ready, exit 0
    await asyncio.to_thread(_enter_a_train_ctx)
    code, out, err = await _status(job_env, "--no-color", "--interval", "0.2")
    assert code == 0, (out, err)
    assert "2/2 servers ready" in out


async def test_status_says_when_the_registry_cannot_be_read(job_env):
    env = {**job_env, "PERSIA_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    code, out, err = await _status(env, "--no-color")
    assert code == 2 and "cannot reach Redis" in err, (out, err)


async def _read_until(
    stream: asyncio.StreamReader, text: str, timeout_s: float, seen: bytearray
) -> None:
    """Read ``stream`` into ``seen`` until ``text`` appears (a frame was drawn)."""

    async def read() -> None:
        while text.encode() not in seen:
            chunk = await stream.read(4096)
            if not chunk:
                raise AssertionError(f"output ended before {text!r}: {bytes(seen[-2000:])!r}")
            seen.extend(chunk)

    await asyncio.wait_for(read(), timeout_s)


async def _watch_proc(job_env: dict, interval: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "persia.launcher",
        "status",
        "--watch",
        "--no-color",
        "--width",
        "200",
        "--interval",
        interval,
        cwd=REPO,
        env={**os.environ, **job_env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_watch_redraws_until_ctrl_c(job_env, registry_settings):
    """--watch keeps scraping (the rank's step moves between redraws) and Ctrl-C ends it
    with exit 0 and the last frame printed."""
    stats = RankStats(loss_every=1)
    stats.step_done(1, 10, torch.tensor(0.5), 1.0, True)
    ingress = Ingress(
        BatchQueue(4, rank=0, world_size=1), registry_settings=registry_settings, stats=stats
    )
    await ingress.start()
    seen = bytearray()
    try:
        proc = await _watch_proc(job_env, "0.2")
        await _read_until(proc.stdout, "loss 0.5", 60, seen)  # the first frame (slow at load)
        stats.step_done(77, 10, torch.tensor(0.25), 1.0, True)
        await _read_until(proc.stdout, "step 77", 30, seen)  # redrawn after the first look
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        await ingress.stop()
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    text = (bytes(seen) + out).decode()
    assert "step 77" in text and "loss 0.25" in text


async def test_ctrl_c_during_a_scrape_ends_the_watch(job_env, registry_settings):
    """Ctrl-C that lands while a scrape waits on a silent process ends --watch at once with
    exit 0 (under load most of a watch is scraping, not sleeping between frames)."""
    accepted: list[asyncio.StreamWriter] = []
    silent = await asyncio.start_server(  # accepts, never answers
        lambda _reader, writer: accepted.append(writer), "127.0.0.1", 0
    )
    port = silent.sockets[0].getsockname()[1]
    registry = Registry(registry_settings)
    await registry.register(
        ServiceRecord(
            role=ROLE_EMBEDDING_PS, replica_index=0, replica_size=1, address=f"127.0.0.1:{port}"
        )
    )
    seen = bytearray()
    try:
        proc = await _watch_proc(job_env, "0.1")
        await _read_until(proc.stdout, "unreachable", 90, seen)  # one scrape timed out
        proc.send_signal(signal.SIGINT)  # the next scrape is waiting on the silent server
        out, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        await registry.close()
        silent.close()
        for writer in accepted:
            writer.close()
        await silent.wait_closed()
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode(), err.decode()


async def test_status_sends_the_job_token(services, job_env, monkeypatch):
    """With PERSIA_AUTH_TOKEN, /health and /metrics need it: status sends it, and without it
    says what to set instead of showing a half-empty row."""
    token = "t" * 32
    monkeypatch.setenv("PERSIA_AUTH_TOKEN", token)
    services(
        "pyrsia.services.embedding_ps", ["--port", "0"], role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    code, out, err = await _status(
        {**job_env, "PERSIA_AUTH_TOKEN": token}, "--no-color", "--width", "250", "--interval", "0.2"
    )
    row = _row(out, f"{ROLE_EMBEDDING_PS}/0")
    assert "not ready (not configured" in row and "entries 0" in row, (out, err)
    env = {k: v for k, v in os.environ.items() if k != "PERSIA_AUTH_TOKEN"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "persia.launcher",
        "status",
        "--no-color",
        "--width",
        "250",
        "--interval",
        "0.2",
        cwd=REPO,
        env={**env, **job_env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out_b, _ = await asyncio.wait_for(proc.communicate(), 60)
    row = _row(out_b.decode(), f"{ROLE_EMBEDDING_PS}/0")
    assert proc.returncode == 1 and "refused (401: set PERSIA_AUTH_TOKEN" in row, row
