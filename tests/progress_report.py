"""A readable ``pytest -q``: one line per finished test file, and the slowest files at the end.

``make test`` runs ``pytest -q``, which prints a dot per test: on a 2-core machine that is
fifteen minutes of dots. With ``-q`` this plugin (registered by tests/conftest.py) prints
nothing for a passed or skipped test and, when a file's last test finishes, one line::

    [ 37/161 files   512/1412 tests  4m05s] tests/test_codec.py: 24 passed in 1.2s

A failure still shows its ``F`` (or ``E``) at once, and its file's line names the failed
tests. Before pytest's own closing line (``N passed in ...``, which stays last and
unchanged) it lists the slowest files. Other verbosities (``-v``, plain) keep pytest's
own output.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest

SLOWEST_FILES = 12
_RANK = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}


def _fmt_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def _outcome(report: pytest.TestReport) -> str:
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return "skipped" if report.skipped else "passed"


class FileProgress:
    """Counts each file's tests and time; writes a line when the file's last test is done."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.monotonic()
        self.tests_in: dict[str, int] = {}
        self.outcome: dict[str, str] = {}
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.done: Counter[str] = Counter()
        self.files_done = 0
        self.tests_done = 0

    @property
    def terminal(self):  # the TerminalReporter
        return self.config.pluginmanager.get_plugin("terminalreporter")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.tests_in = dict(Counter(item.nodeid.split("::")[0] for item in session.items))
        if hasattr(self.terminal, "_show_progress_info"):
            # pytest's "[ 20%]" (written when a line of letters fills, and after the last test)
            # says nothing once the file lines count; pytest has no public switch for it
            self.terminal._show_progress_info = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport):
        """No letter for a passed or skipped test (the file's line counts them)."""
        if hasattr(report, "wasxfail"):
            return None
        if report.when == "call" and report.passed:
            return "passed", "", ""
        if report.skipped:
            return "skipped", "", ""
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::")[0]
        self.seconds[path] += report.duration
        new = _outcome(report)
        if _RANK[new] > _RANK[self.outcome.get(report.nodeid, "passed")]:
            self.outcome[report.nodeid] = new
        else:
            self.outcome.setdefault(report.nodeid, new)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        path = nodeid.split("::")[0]
        self.done[path] += 1
        self.tests_done += 1
        if self.done[path] == self.tests_in.get(path):
            self.files_done += 1
            self._write_file_line(path)

    def _write_file_line(self, path: str) -> None:
        ids = [n for n in self.outcome if n.split("::")[0] == path]
        counts = Counter(self.outcome[n] for n in ids)
        parts = [f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped") if counts[k]]
        failed = [n.split("::", 1)[1] for n in ids if self.outcome[n] in ("failed", "error")]
        head = (
            f"[{self.files_done:>3}/{len(self.tests_in)} files {self.tests_done:>5}/"
            f"{sum(self.tests_in.values())} tests {_fmt_elapsed(time.monotonic() - self.started)}]"
        )
        line = f"{head} {path}: {', '.join(parts)} in {self.seconds[path]:.1f}s"
        if failed:
            line += f"  FAILED: {', '.join(failed)}"
        if self.terminal is None:
            return
        tw = self.terminal._tw
        if tw.width_of_current_line:
            tw.line()
        tw.line(line, red=bool(failed))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:SLOWEST_FILES]
        terminalreporter.write_sep("-", "slowest files")
        for path, seconds in slowest:
            terminalreporter.write_line(f"{seconds:8.1f}s  {path}")


def pytest_configure(config: pytest.Config) -> None:
    """Register :class:`FileProgress` when pytest runs with ``-q`` (as ``make test`` does);
    tests/conftest.py calls this, ``-p tests.progress_report`` loads it elsewhere."""
    if config.get_verbosity() == -1 and not config.option.collectonly:
        config.pluginmanager.register(FileProgress(config), "pyrsia-file-progress")
