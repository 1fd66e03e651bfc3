"""Every mistake ends with one line naming the process that found it, what was wrong and the
fix; the launcher names the process that failed first (pyrsia/shared/failure_report.py).

Each case runs the real command (a service, ``persia-launcher run``, ``python train.py``)
and checks its exact last line and exit code. The jobs are the first-job example
(examples/first_job) with one mistake each, run side by side to keep the file fast.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.redis_server import free_port

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "first_job"
LAUNCHER = [sys.executable, "-m", "persia.launcher"]
TRAIN_STEP = "        ctx.backward(loss_fn(output, labels[0]))\n"
BAD_SLOT_LOADER = """\
import numpy as np
from persia.ctx import DataCtx
from persia.embedding.data import IDTypeFeatureWithSingleID, Label, NonIDTypeFeature, PersiaBatch

ids = np.arange(128, dtype=np.uint64)
with DataCtx() as ctx:
    ctx.send_data(PersiaBatch(
        [IDTypeFeatureWithSingleID("user", ids), IDTypeFeatureWithSingleID("country", ids)],
        non_id_type_features=[NonIDTypeFeature(np.zeros((128, 2), np.float32))],
        labels=[Label(np.zeros((128, 1), np.float32))],
    ))
"""
FLOAT_IDS_LOADER = """\
import numpy as np
from persia.ctx import DataCtx
from persia.embedding.data import IDTypeFeatureWithSingleID, PersiaBatch

batch = PersiaBatch([IDTypeFeatureWithSingleID("user", np.arange(4, dtype=np.float32))])
with DataCtx() as ctx:
    ctx.send_data(batch)
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSIA_", "LOG_LEVEL"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PERSIA_LOG_DIR=str(tmp_path / "logs"))
    env.update(extra)
    return env


def _last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


def _example(tmp_path: Path, train_edit: tuple[str, str] | None = None) -> Path:
    """A copy of the first-job example in ``tmp_path/job``; ``train_edit`` replaces a line."""
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job)
    if train_edit is not None:
        text = (job / "train.py").read_text()
        assert train_edit[0] in text
        (job / "train.py").write_text(text.replace(train_edit[0], train_edit[1]))
    return job


def _run_job(job: Path, tmp_path: Path, redis_url: str, loader: str = "data_loader.py"):
    argv = [
        *LAUNCHER,
        "run",
        "--nn-worker",
        str(job / "train.py"),
        "--data-loader",
        str(job / loader),
        "--embedding-config",
        str(job / "embedding_config.yml"),
    ]
    env = _env(tmp_path, PERSIA_REDIS_URL=redis_url, PERSIA_JOB_ID=f"err-{uuid.uuid4().hex[:8]}")
    return subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _line_of(path: Path, text: str) -> int:
    return path.read_text().splitlines().index(text.rstrip("\n")) + 1


@pytest.mark.timeout(240)
def test_run_names_the_process_that_failed_first_and_the_cause(tmp_path_factory, redis_server):
    """Three jobs side by side: 1-D labels against a (batch, 1) output (the NN worker finds
    it; the data loader dies after it), an exception in train.py (its own traceback, once),
    and a slot missing from embedding_config (the embedding worker finds it)."""
    cases = {}
    label = tmp_path_factory.mktemp("label")
    job = _example(label, (TRAIN_STEP, TRAIN_STEP.replace("labels[0]", "labels[0].reshape(-1)")))
    cases["label"] = (label, job, _run_job(job, label, redis_server.url))
    boom = tmp_path_factory.mktemp("boom")
    job = _example(boom, (TRAIN_STEP, '        raise RuntimeError("boom in my model")\n'))
    cases["boom"] = (boom, job, _run_job(job, boom, redis_server.url))
    slot = tmp_path_factory.mktemp("slot")
    job = _example(slot)
    (job / "bad_slot.py").write_text(BAD_SLOT_LOADER)
    cases["slot"] = (slot, job, _run_job(job, slot, redis_server.url, "bad_slot.py"))
    out = {name: proc.communicate(timeout=200)[0] for name, (_, _, proc) in cases.items()}
    codes = {name: proc.returncode for name, (_, _, proc) in cases.items()}

    tmp, job, _ = cases["label"]
    line = _line_of(job / "train.py", TRAIN_STEP.replace("labels[0]", "labels[0].reshape(-1)"))
    assert _last_line(out["label"]) == (
        "error: nn_worker/0 failed first: ValueError: Target size (torch.Size([128])) must be "
        f"the same as input size (torch.Size([128, 1])) at train.py:{line}; the labels' shape "
        "[128] is not the model output's [128, 1]: send labels of the output's shape "
        "(Label(y.reshape(-1, 1)) in data_loader.py for one score per sample) "
        f"(traceback: {tmp / 'logs' / 'nn_worker-0.log'})"
    ), out["label"][-3000:]
    assert codes["label"] == 1
    assert "Target size" in (tmp / "logs" / "nn_worker-0.log").read_text()

    tmp, job, _ = cases["boom"]
    line = _line_of(job / "train.py", '        raise RuntimeError("boom in my model")\n')
    assert _last_line(out["boom"]) == (
        f"error: nn_worker/0 failed first: RuntimeError: boom in my model at train.py:{line} "
        f"(traceback: {tmp / 'logs' / 'nn_worker-0.log'})"
    ), out["boom"][-3000:]
    assert codes["boom"] == 1
    assert out["boom"].count("Traceback (most recent call last)") == 1, out["boom"][-3000:]
    assert re.search(
        rf'^nn_worker +\|   File "{re.escape(str(job / "train.py"))}", line {line}',
        out["boom"],
        re.M,
    ), out["boom"][-3000:]
    assert "runpy" not in out["boom"]  # the script's frames, not the launcher's

    tmp, job, _ = cases["slot"]
    assert _last_line(out["slot"]) == (
        "error: data_loader/0 failed first: embedding_worker/0 refused batch 0: "
        "batch.id_type_features[1].name: slot 'country' is not in embedding_config's "
        "slots_config (item, user): add it there, or leave it out of the batch "
        f"(traceback: {tmp / 'logs' / 'data_loader-0.log'})"
    ), out["slot"][-3000:]
    assert codes["slot"] == 1
    assert "Traceback" not in out["slot"], out["slot"][-3000:]


@pytest.mark.timeout(60)
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path, redis_server):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [
                *LAUNCHER,
                "embedding-parameter-server",
                "--port",
                str(port),
                "--embedding-config",
                str(EXAMPLE / "embedding_config.yml"),
            ],
            env=_env(tmp_path, PERSIA_REDIS_URL=redis_server.url, PERSIA_JOB_ID="port-in-use"),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=50,
        )
    log = tmp_path / "logs" / "embedding_parameter_server-0.log"
    assert _last_line(proc.stderr) == (
        f"error: embedding_parameter_server/0: port {port} on 127.0.0.1 is already in use by "
        "another process: stop that process, or pick a free port (--port 0 lets the system "
        f"choose one) (traceback: {log})"
    ), proc.stderr
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "address already in use" in log.read_text().lower()


@pytest.mark.timeout(60)
def test_redis_down_is_reported_within_5_seconds(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    proc = subprocess.Popen(
        [
            *LAUNCHER,
            "embedding-worker",
            "--embedding-config",
            str(EXAMPLE / "embedding_config.yml"),
        ],
        env=_env(tmp_path, PERSIA_REDIS_URL=url),
        cwd=tmp_path,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    with proc.stderr:
        lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stderr]
    assert proc.wait(timeout=30) == 2
    started = lines[0][0]  # its first line: imports done, logging set up
    assert lines[-1][1] == (
        f"error: embedding_worker/0: cannot reach Redis at {url} (set by PERSIA_REDIS_URL): "
        f"Error 111 connecting to {url[8:-2]}. Connection refused.; start a Redis there or "
        "point PERSIA_REDIS_URL at one every process can reach "
        f"(traceback: {tmp_path / 'logs' / 'embedding_worker-0.log'})"
    ), lines
    assert lines[-1][0] - started <= 5.0, lines  # the wait is 3 s (REDIS_STARTUP_WAIT_S)


@pytest.mark.timeout(60)
def test_float_ids_are_one_line_naming_the_data_loader(tmp_path):
    (tmp_path / "loader.py").write_text(FLOAT_IDS_LOADER)
    proc = subprocess.run(
        [*LAUNCHER, "data-loader", str(tmp_path / "loader.py")],
        env=_env(
            tmp_path,
            PERSIA_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
            PERSIA_WAIT_TIMEOUT_S="1",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert _last_line(proc.stderr) == (
        "error: data_loader/0: IDTypeFeatureWithSingleID 'user': data: expected a 1-D numpy "
        "array of non-negative integer ids: uint64, a signed integer dtype (int8 .. int64) or "
        "uint8 .. uint32, converted to uint64, got array of dtype float32 and shape (4,); float "
        "ids are refused (cast exact integer ids with .astype(np.uint64)) "
        f"(traceback: {tmp_path / 'logs' / 'data_loader-0.log'})"
    ), proc.stderr
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr


def _redis_answers_on_6379() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.skipif(_redis_answers_on_6379(), reason="a Redis answers on the default port here")
def test_python_train_py_without_the_launcher_is_one_line_and_always_exits(tmp_path):
    """Three at once: interpreter shutdown used to hang in 2 of 7 runs."""
    job = _example(tmp_path)
    env = _env(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "train.py"],
            cwd=job,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    for proc in procs:
        out = proc.communicate(timeout=90)[0]
        assert _last_line(out) == (
            "error: train.py: started without the launcher, and no Redis answers at "
            "redis://127.0.0.1:6379/0 (PERSIA_REDIS_URL is unset): start the job with "
            "persia-launcher run --nn-worker train.py --data-loader data_loader.py "
            "--embedding-config embedding_config.yml (it starts Redis and every service), or "
            "set PERSIA_REDIS_URL to a running job's Redis "
            f"(traceback: {tmp_path / 'logs' / 'train.py.log'})"
        ), out
        assert proc.returncode == 2
        assert "Traceback" not in out
