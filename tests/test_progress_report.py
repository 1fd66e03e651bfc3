"""``pytest -q`` prints a line per finished file and the slowest files, and keeps pytest's
closing ``N passed`` line last and unchanged (CI reads it): tests/progress_report.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SAMPLE = {
    "test_a.py": "def test_one():\n    pass\n\ndef test_two():\n    pass\n",
    "test_b.py": (
        "import pytest\n\ndef test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n\n"
        "@pytest.mark.skip(reason='x')\ndef test_skipped():\n    pass\n"
    ),
}


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    for name, text in SAMPLE.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *flags,
            "-p",
            "tests.progress_report",
            "-p",
            "no:cacheprovider",
            "test_a.py",
            "test_b.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.timeout(60)
def test_quiet_run_prints_a_line_per_file_and_keeps_the_closing_line(tmp_path):
    out = _run(tmp_path, "-q").stdout
    lines = out.rstrip().splitlines()
    assert re.fullmatch(
        r"\[  1/2 files     2/5 tests 0m\d\ds\] test_a.py: 2 passed in \d+\.\ds", lines[0]
    )
    file_b = next(ln for ln in lines if "test_b.py:" in ln)
    assert re.search(
        r"\] test_b.py: 1 passed, 1 failed, 1 skipped in \d+\.\ds  FAILED: test_bad$", file_b
    )
    assert not any("%]" in ln for ln in lines)  # no dots, no "[ 20%]"
    assert any(re.search(r"-+ slowest files -+", ln) for ln in lines)
    assert re.fullmatch(r"FAILED test_b.py::test_bad - assert 1 == 2", lines[-2])
    assert re.fullmatch(r"1 failed, 3 passed, 1 skipped in \d+\.\d+s", lines[-1])


@pytest.mark.timeout(60)
def test_verbose_run_keeps_pytests_own_lines(tmp_path):
    out = _run(tmp_path, "-v").stdout
    assert "test_a.py::test_one PASSED" in out and "files" not in out.split("===")[0]
