"""``persia-launcher run``: a user's whole job on this machine from one command.

Real processes throughout: the Adult example through ``run`` on a terminal (a pty), two
``run``s at once on one machine, SIGTERM stopping every process, a failing child stopping
the job, and a bad flag refused before anything starts.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from persia._launch.console import _parse_metrics, progress_text

REPO = Path(__file__).resolve().parent.parent
ADULT = REPO / "examples" / "adult_income"
LAUNCHER = [sys.executable, "-m", "persia.launcher", "run"]
ADULT_ARGS = [
    "--nn-worker",
    str(ADULT / "train.py"),
    "--data-loader",
    str(ADULT / "data_loader.py"),
    "--embedding-config",
    str(ADULT / "config" / "embedding_config.yml"),
    "--global-config",
    str(ADULT / "config" / "global_config.yml"),
]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PERSIA_REDIS_URL", "PERSIA_JOB_ID")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@pytest.fixture(scope="module", autouse=True)
def adult_data():
    subprocess.run(
        [sys.executable, str(ADULT / "data_prep.py")], check=True, cwd=REPO, capture_output=True
    )


def _descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _redis_port(out: str) -> int:
    return int(re.search(r"run\s+\| job run-[0-9a-f]{8} on redis://127\.0\.0\.1:(\d+)/0", out)[1])


def _port_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


@pytest.mark.timeout(400)
def test_adult_through_run_on_a_terminal(tmp_path):
    """Exit 0, the final AUC line prefixed with its process, the live progress line drawn
    (steps, samples/s, loss), and nothing left running: Redis's port is closed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*LAUNCHER, *ADULT_ARGS],
        cwd=tmp_path,
        env=_env(EPOCHS="4"),  # ~5 s of training: one epoch (~1.2 s) can fall between two polls
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer of the pty has gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(timeout=30)
    out = b"".join(chunks).decode("utf-8", "replace")
    plain = re.sub(r"\x1b\[[0-9;]*[mK]", "", out)
    (tmp_path / "run.log").write_text(plain)
    assert code == 0, plain[-4000:]
    auc = re.search(r"nn_worker\s+\| test AUC: (0\.\d+)", plain)
    assert auc and float(auc[1]) > 0.85, plain[-4000:]
    assert re.search(r"\[\d+:\d\d\] step \d+  [\d,]+ samples/s  loss \d\.\d{4}", plain), plain[
        -4000:
    ]
    assert "\r\x1b[K" in out  # the progress line is redrawn in place, not appended
    assert re.search(r"run\s+\| first training step within [\d.]+s of the start", plain)
    assert re.search(
        r"run\s+\| nn_worker exited with code 0 after \d+s; every process stopped", plain
    )
    for name in ("embedding_parameter_server", "embedding_worker", "data_loader"):
        assert re.search(rf"^\x1b?.*{name}\s+\| ", plain, re.M), name
    assert not re.search(r"^redis\s+\| ", plain, re.M), "Redis is quiet unless something is wrong"
    assert _port_closed(_redis_port(plain))


@pytest.mark.timeout(500)
def test_two_runs_at_once_on_one_machine(tmp_path):
    """Each run gets its own Redis, job id and ports: both train and exit 0."""
    env = _env(MAX_TRAIN_STEPS="40")
    procs = [
        subprocess.Popen(
            [*LAUNCHER, *ADULT_ARGS],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
        assert re.search(r"nn_worker\s+\| test AUC: 0\.\d+", out), out[-4000:]
        assert "\r\x1b[K" not in out  # no progress line drawn into a pipe
    jobs = [re.search(r"job (run-[0-9a-f]{8})", out)[1] for out in outs]
    assert jobs[0] != jobs[1]
    assert _redis_port(outs[0]) != _redis_port(outs[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_process(tmp_path, sig):
    """SIGTERM or Ctrl-C's SIGINT while the job starts: every child and grandchild exits, run
    exits 128 + the signal's number."""
    proc = subprocess.Popen(
        [*LAUNCHER, *ADULT_ARGS],
        cwd=tmp_path,
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "registered embedding_worker/0" in line:
            break
    family = _descendants(proc.pid)
    assert len(family) >= 5, "".join(lines)  # redis, 2 servers, nn-worker launcher, loader
    proc.send_signal(sig)
    rest = proc.communicate(timeout=90)[0]
    out = "".join(lines) + rest
    assert proc.returncode == 128 + sig, out[-4000:]
    assert re.search(rf"run\s+\| stopped by {sig.name}", out), out[-3000:]
    assert not [pid for pid in family if _alive(pid)], out[-3000:]
    assert "killed" not in rest, rest[-3000:]  # every process left on its own SIGTERM


def test_a_failing_child_stops_the_job_with_its_code(tmp_path):
    loader = tmp_path / "bad_loader.py"
    loader.write_text("import sys\nprint('no data here', flush=True)\nsys.exit(3)\n")
    args = list(ADULT_ARGS)
    args[args.index("--data-loader") + 1] = str(loader)
    proc = subprocess.run(
        [*LAUNCHER, *args],
        cwd=tmp_path,
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert re.search(r"data_loader\s+\| no data here", proc.stdout)
    assert re.search(
        r"run\s+\| data_loader exited with code 3 before the NN worker finished", proc.stdout
    )
    assert _port_closed(_redis_port(proc.stdout))


def test_a_missing_file_is_one_line_before_anything_starts(tmp_path):
    args = list(ADULT_ARGS)
    args[args.index("--nn-worker") + 1] = str(tmp_path / "trian.py")
    proc = subprocess.run(
        [*LAUNCHER, *args], cwd=tmp_path, env=_env(), text=True, capture_output=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'trian.py'}: no such file (set by --nn-worker)"
    ]


def test_a_misspelt_config_key_is_one_line_before_anything_starts(tmp_path):
    config = tmp_path / "global_config.yml"
    config.write_text(
        "common_config:\n  checkpointing_config:\n    checkpoint_dir: /tmp/c\n"
        "    checkpoint_every_n_step: 100\n"
    )
    args = list(ADULT_ARGS)
    args[args.index("--global-config") + 1] = str(config)
    proc = subprocess.run(
        [*LAUNCHER, *args], cwd=tmp_path, env=_env(), text=True, capture_output=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert 'checkpoint_every_n_step: unknown key (did you mean "checkpoint_every_n_steps"?)' in line


def test_progress_text():
    metrics = _parse_metrics(
        "# HELP x\npyrsia_nn_worker_steps 12.0\npyrsia_nn_worker_samples_per_second 1500.5\n"
        'pyrsia_nn_worker_loss NaN\npyrsia_nn_worker_step_phase_seconds{phase="a"} 1.0\n'
    )
    assert progress_text([metrics], 65) == "[1:05] step 12  1,500 samples/s"  # no loss yet
    other = dict(metrics, pyrsia_nn_worker_steps=11.0, pyrsia_nn_worker_loss=0.5)
    metrics["pyrsia_nn_worker_loss"] = 0.3
    assert progress_text([metrics, other], 5) == "[0:05] step 11  3,001 samples/s  loss 0.4000"
    assert progress_text([], 0) == "[0:00] waiting for the NN worker's first step"


def test_the_live_line_stays_below_the_lines_and_within_the_terminal(monkeypatch):
    import io

    from persia._launch.console import Output

    monkeypatch.setenv("COLUMNS", "40")
    stream = io.StringIO()
    out = Output(stream, live=True, color=False)
    out.status("[0:01] step 1  " + "x" * 100)
    out.line("nn_worker", "hello")
    text = stream.getvalue()
    status = "[0:01] step 1  " + "x" * 24  # 39 columns: a wrapped line would not redraw
    assert text == f"\r\x1b[K{status}\r\x1b[K{'nn_worker':<26} | hello\n{status}"
