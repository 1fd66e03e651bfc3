"""The first-job tutorial runs exactly as docs/getting-started/first-job.md shows it.

The command is read out of the page's first ``bash`` block that starts with
``persia-launcher run`` and run from the repository's root, as a user would paste it; the
job must exit 0 and print its result line with a test AUC showing that it learned. The
same output must be quiet (no Redis banner or memory-overcommit warning, no traceback) and
its progress bars must come out as lines of their own. The page must include every file of
``examples/first_job/`` through the snippets extension, so it cannot show other code than
the test runs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "getting-started" / "first-job.md"
EXAMPLE = REPO / "examples" / "first_job"
RESULT = re.compile(r"^nn_worker\s+\| first job: trained (\d+) steps, test AUC (\d\.\d{4})$", re.M)


def page_command() -> list[str]:
    """The first ``persia-launcher run`` command of the page's bash blocks, as argv."""
    blocks = re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    commands = [b for b in blocks if b.lstrip().startswith("persia-launcher run")]
    assert commands, f"{PAGE} shows no bash block starting with 'persia-launcher run'"
    return shlex.split(commands[0].replace("\\\n", " "))


def page_auc_range() -> tuple[float, float]:
    """The range the page promises the test AUC in ("comes out between 0.84 and 0.87"), which
    its sample output's number must fall in too."""
    text = PAGE.read_text()
    found = re.search(r"test AUC comes out between (\d\.\d+) and (\d\.\d+)", text)
    assert found, f"{PAGE} says no range for the test AUC"
    low, high = float(found[1]), float(found[2])
    shown = [float(a) for _, a in RESULT.findall(text)]
    assert shown and all(low <= a <= high for a in shown), (shown, low, high)
    return low, high


def test_the_page_shows_every_file_of_the_example_through_snippets():
    included = re.findall(r'^--8<-- "([^"]+)"$', PAGE.read_text(), re.M)
    files = sorted(
        p.relative_to(REPO).as_posix()
        for p in EXAMPLE.iterdir()
        if p.is_file() and p.suffix in (".py", ".yml")
    )
    assert sorted(included) == files
    argv = page_command()
    assert argv[:2] == ["persia-launcher", "run"]
    for flag, name in (
        ("--nn-worker", "train.py"),
        ("--data-loader", "data_loader.py"),
        ("--embedding-config", "embedding_config.yml"),
        ("--global-config", "global_config.yml"),
    ):
        assert argv[argv.index(flag) + 1] == f"examples/first_job/{name}"


@pytest.mark.timeout(300)
def test_the_first_job_runs_as_the_page_shows_it_and_quietly():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PERSIA_REDIS_URL", "PERSIA_JOB_ID", "LOG_LEVEL", "PERSIA_VERBOSE")
    }
    env["PATH"] = (
        f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's persia-launcher
    )
    proc = subprocess.run(
        page_command(),
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=280,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:]
    found = RESULT.findall(out)
    assert len(found) == 1, out[-5000:]
    steps, auc = int(found[0][0]), float(found[0][1])
    low, high = page_auc_range()
    assert steps == 150 and low <= auc <= high, (found, low, high)  # the number the page says
    # nothing failed: the job's log folder (tracebacks of failed processes) is gone
    job = re.search(r"^run\s+\| job (run-[0-9a-f]{8}) on ", out, re.M)
    assert job, out[-3000:]
    assert not list(Path(tempfile.gettempdir()).glob(f"persia-{job[1]}-*")), job[1]
    # quiet by default
    assert not re.search(r"^redis\s+\|", out, re.M), "Redis printed lines:\n" + out
    for noise in ("Redis is starting", "overcommit", "Traceback"):
        assert noise not in out, f"{noise!r} in the output:\n{out}"
    # progress bars as lines of their own, not glued to the next log line
    assert re.search(r"^nn_worker\s+\| train: \d+it \[", out, re.M), out
    assert re.search(r"^data_loader\s+\| send: 100%", out, re.M), out
    assert not re.search(r"(it/s\]|s/it\])[ \t]*\S", out), "a bar glued to other text:\n" + out
