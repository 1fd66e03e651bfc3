"""persia.logger.get_default_logger honours PERSIA's arguments (each in a fresh process:
the default logger is process-wide)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_script(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": "", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_file_logger_level_and_name_are_honoured(tmp_path):
    proc = run_script(
        """
        import logging
        from persia.logger import get_default_logger
        log = get_default_logger("nn_worker", log_level=logging.WARNING,
                                 log_filename="run.log", enable_file_logger=True)
        log.info("hidden info")
        log.warning("kept warning")
        print(log.name, log.level)
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["nn_worker", str(30)]
    written = (tmp_path / "run.log").read_text()
    assert "kept warning" in written and "hidden info" not in written
    assert "kept warning" in proc.stderr and "hidden info" not in proc.stderr


def test_no_file_unless_enabled_and_level_from_env(tmp_path):
    proc = run_script(
        """
        from persia.logger import get_default_logger
        log = get_default_logger(log_filename="never.log")
        log.debug("debug line")
        """,
        tmp_path,
        LOG_LEVEL="DEBUG",
    )
    assert proc.returncode == 0, proc.stderr
    assert "debug line" in proc.stderr
    assert not (tmp_path / "never.log").exists()


def test_later_call_applies_explicit_options(tmp_path):
    # PERSIA's modules call get_default_logger() at import; the script's own call with
    # options must still take effect on the same logger.
    proc = run_script(
        """
        from persia.logger import get_default_logger
        first = get_default_logger()
        second = get_default_logger("ignored", log_level="ERROR", enable_file_logger=True,
                                    log_filename="later.log")
        assert first is second
        second.warning("below error")
        second.error("an error")
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "later.log").read_text().count("an error") == 1
    assert "below error" not in proc.stderr


def test_error_redirect_keeps_records_above_its_level(tmp_path):
    proc = run_script(
        """
        import logging
        from persia.logger import get_default_logger
        log = get_default_logger(log_level="DEBUG", enable_err_redirect=True,
                                 err_redirect_filepath="err.log", err_redirect_level=logging.WARNING)
        log.info("info line")
        log.warning("warning line")
        log.error("error line")
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "err.log").read_text()
    assert "error line" in text
    assert "warning line" not in text and "info line" not in text


def test_bad_arguments_are_errors_not_dropped(tmp_path):
    proc = run_script(
        """
        from persia.logger import get_default_logger
        for kwargs in ({"log_level": "LOUD"}, {"enable_file_logger": True, "log_filename": ""},
                       {"log_file": "x.log"}):
            try:
                get_default_logger(**kwargs)
            except (TypeError, ValueError) as exc:
                print(type(exc).__name__, str(exc).split(":")[0])
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("InvalidInputError log_level")
    assert lines[1].startswith("InvalidInputError log_filename")
    assert lines[2].startswith("TypeError")


# --- library log lines (persia.* loggers) show by default, as PERSIA's do --------------------

EPL_LINE = "cluster.run_visible_devices: CUDA_VISIBLE_DEVICES=0"
EPL_INIT = """
    import persia.epl as epl
    from persia.epl.cluster import apply_cluster_config
    apply_cluster_config(epl.Config({"cluster.run_visible_devices": "0"}))
"""


def test_library_info_lines_show_without_any_logging_setup(tmp_path):
    proc = run_script(EPL_INIT, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(EPL_LINE) == 1 and "INFO" in proc.stderr
    hidden = run_script(EPL_INIT, tmp_path, LOG_LEVEL="WARNING")
    assert hidden.returncode == 0 and EPL_LINE not in hidden.stderr


def test_log_level_debug_reaches_library_debug_lines(tmp_path):
    code = "import persia, logging\nlogging.getLogger('persia.x').debug('deep detail')\n"
    assert "deep detail" in run_script(code, tmp_path, LOG_LEVEL="DEBUG").stderr
    assert "deep detail" not in run_script(code, tmp_path).stderr


def test_logging_configured_before_import_is_respected(tmp_path):
    proc = run_script(
        """
        import logging
        logging.basicConfig(level=logging.WARNING, format="USER %(name)s %(message)s")
        import persia
        logging.getLogger("persia.epl.plan").info("an info line")
        logging.getLogger("persia.epl.plan").warning("a warning line")
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "an info line" not in proc.stderr
    assert proc.stderr.splitlines() == ["USER persia.epl.plan a warning line"]


def test_logging_configured_after_import_prints_each_line_once(tmp_path):
    proc = run_script(
        "import logging, persia\n"
        + 'logging.basicConfig(level=logging.INFO, format="USER %(message)s")\n'
        + textwrap.dedent(EPL_INIT),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"USER {EPL_LINE}"]


def test_default_logger_takes_the_persia_logger_over_without_duplicates(tmp_path):
    proc = run_script(
        """
        from persia.logger import get_default_logger
        log = get_default_logger()
        log.info("script line")
        import logging
        logging.getLogger("persia.epl").info("library line")
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("script line") == 1 and proc.stderr.count("library line") == 1
