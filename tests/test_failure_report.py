"""pyrsia/shared/failure_report.py in one process: the line, the log file, the records and
which one ``persia-launcher run`` blames (tests/test_error_lines.py runs the real commands)."""

from __future__ import annotations

import json

import pytest

from pyrsia.shared import failure_report as fr
from pyrsia.shared.errors import RegistryError
from pyrsia.shared.settings import Settings


def _raised_in_script(tmp_path, code: str) -> BaseException:
    script = tmp_path / "train.py"
    script.write_text(code)
    try:
        exec(compile(script.read_text(), str(script), "exec"), {})
    except Exception as exc:
        return exc
    raise AssertionError("the script raised nothing")


def test_a_user_exception_names_its_line_and_the_known_fix(tmp_path):
    exc = _raised_in_script(
        tmp_path,
        "x = 1\nraise ValueError('Target size (torch.Size([8])) "
        "must be the same as input size (torch.Size([8, 1]))')\n",
    )
    assert fr.describe(exc) == (
        "ValueError: Target size (torch.Size([8])) must be the same as input size "
        "(torch.Size([8, 1])) at train.py:2; the labels' shape [8] is not the model output's "
        "[8, 1]: send labels of the output's shape (Label(y.reshape(-1, 1)) in data_loader.py "
        "for one score per sample)"
    )
    assert fr.exit_code(exc) == 1 and fr.exit_code(RegistryError("x")) == 2


def test_report_writes_the_log_and_the_record_and_prints_one_line(tmp_path, capsys):
    settings = Settings.from_env({"PERSIA_LOG_DIR": str(tmp_path)})
    exc = RegistryError("cannot reach Redis at redis://127.0.0.1:1/0: start one")
    try:
        raise exc
    except RegistryError:
        code = fr.report(exc, settings, "embedding_worker/0")
    assert code == 2
    log = tmp_path / "embedding_worker-0.log"
    assert capsys.readouterr().err == (
        f"error: embedding_worker/0: cannot reach Redis at redis://127.0.0.1:1/0: start one "
        f"(traceback: {log})\n"
    )
    assert "Traceback (most recent call last)" in log.read_text()
    record = json.loads((tmp_path / "embedding_worker-0.failure.json").read_text())
    assert record["process"] == "embedding_worker/0" and record["code"] == 2


def test_run_blames_the_earliest_record_and_a_noted_failure_keeps_its_time(tmp_path, capsys):
    settings = Settings.from_env({"PERSIA_LOG_DIR": str(tmp_path), "PERSIA_PROCESS": "nn_worker/0"})
    first = RuntimeError("boom")
    fr.note_failure(first, settings)  # leaves its `with` block: the time it failed
    later = ConnectionError("ingress gone")
    fr.report(later, settings, "data_loader/0")
    fr.report(first, settings)  # the rank's own report, written after the loader's
    capsys.readouterr()
    blamed = fr.first_failure(tmp_path)
    assert blamed is not None and blamed.process == "nn_worker/0"
    assert blamed.line() == (
        f"error: nn_worker/0 failed first: RuntimeError: boom "
        f"(traceback: {tmp_path / 'nn_worker-0.log'})"
    )
    (tmp_path / "bad.failure.json").write_text("{not json")  # a torn record is skipped
    assert fr.first_failure(tmp_path) == blamed
    assert fr.first_failure(tmp_path / "none") is None


@pytest.mark.parametrize("name", ["", "python"])
def test_a_script_run_by_hand_is_named_after_its_file(monkeypatch, name):
    monkeypatch.setattr(fr, "_NAME", [])  # no service named itself in this process
    monkeypatch.setattr("sys.argv", ["/somewhere/train.py"])
    assert fr.process_name(Settings.from_env({}), name or None) == (name or "train.py")
