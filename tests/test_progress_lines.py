"""Progress bars come out as lines, as they go, when output is a pipe (honcho, ``run``, a log).

The unit tests drive ``ProgressLines`` with tqdm's own writes; the process test starts a
real ``persia-launcher data-loader`` with its output on a pipe, and the script blocks in
the middle of its bar until the test has read the bar's lines: they must arrive while the
process still runs, not when it exits.
"""

from __future__ import annotations

import io
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from pyrsia.shared.progress_lines import ProgressLines

REPO = Path(__file__).resolve().parent.parent


def _lines(text: str) -> list[str]:
    assert "\r" not in text, repr(text)
    return text.splitlines()


def test_each_update_is_a_line():
    sink = io.StringIO()
    out = ProgressLines(sink, interval_s=0.0)
    for _ in tqdm(range(3), desc="train", file=out, mininterval=0, ascii=True):
        pass
    states = [ln.split("|")[0].strip() for ln in _lines(sink.getvalue())]
    states = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]  # 100% drawn twice
    assert states == [
        "train:   0%",
        "train:  33%",
        "train:  67%",
        "train: 100%",
    ]
    assert sink.getvalue().endswith("it/s]\n")


def test_updates_within_the_interval_are_held_back_but_the_last_state_shows():
    sink = io.StringIO()
    out = ProgressLines(sink, interval_s=3600.0)
    for _ in tqdm(range(50), desc="send", file=out, mininterval=0, ascii=True):
        pass
    lines = _lines(sink.getvalue())
    assert len(lines) == 2, lines
    assert lines[0].startswith("send:   0%") and lines[1].startswith("send: 100%|##########| 50/50")


def test_a_log_line_written_during_a_bar_gets_a_line_of_its_own():
    sink = io.StringIO()
    out = ProgressLines(sink, interval_s=3600.0)
    out.write("\rtrain: 0it [00:00, ?it/s]")
    out.write("\rtrain: 5it [00:01, 4.9it/s]")  # held: within the interval
    out.write("2026-11-26 16:00:17,449 INFO registered nn_worker/0\n")
    out.write("plain text\n")
    assert _lines(sink.getvalue()) == [
        "train: 0it [00:00, ?it/s]",
        "train: 5it [00:01, 4.9it/s]",
        "2026-11-26 16:00:17,449 INFO registered nn_worker/0",
        "plain text",
    ]


def test_a_cleared_bar_leaves_nothing_and_plain_text_is_unchanged():
    sink = io.StringIO()
    out = ProgressLines(sink, interval_s=3600.0)
    for _ in tqdm(range(20), desc="test", file=out, mininterval=0, leave=False, ascii=True):
        pass
    out.write("a")
    out.writelines(["b\n", "\nc\n"])
    lines = _lines(sink.getvalue())
    assert lines[0].startswith("test:   0%") and lines[1:] == ["ab", "", "c"], lines


def test_a_piped_process_shows_its_bar_while_it_runs(job_env, tmp_path):
    go = tmp_path / "go"
    script = tmp_path / "data_loader.py"
    script.write_text(
        "import time\nfrom pathlib import Path\nfrom tqdm import tqdm\n"
        "for i in tqdm(range(3), desc='work'):\n"
        "    if i == 0:\n"
        "        time.sleep(2.5)  # past the interval: the next update is a line of its own\n"
        "    if i == 2:\n"
        f"        while not Path({str(go)!r}).exists():\n"
        "            time.sleep(0.05)\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "persia.launcher",
            "data-loader",
            "--replica-index",
            "0",
            "--replica-size",
            "1",
            "--exit-when-done",
            str(script),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **job_env},
    )
    seen: list[str] = []
    buffer = b""
    try:
        deadline = time.monotonic() + 60
        while sum("work:" in ln for ln in seen) < 2:
            assert proc.poll() is None, b"".join(proc.stdout.readlines()).decode()
            assert time.monotonic() < deadline, (
                f"no bar lines within 60 s; lines: {seen}, pending: {buffer!r}"
            )
            if select.select([proc.stdout], [], [], 0.5)[0]:
                buffer += os.read(proc.stdout.fileno(), 65536)
                *done, buffer = buffer.split(b"\n")
                seen += [d.decode() for d in done]
        assert proc.poll() is None, "the bar's lines came only when the process ended"
        bar = [ln for ln in seen if "work:" in ln]
        assert [ln.split("|")[0].strip() for ln in bar] == ["work:   0%", "work:  33%"], seen
    finally:
        go.touch()
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest.decode()
    assert "work: 100%" in rest.decode()
