"""What each NN-worker rank runs: the user's train.py, with the launcher's error handling.

``persia-launcher nn-worker train.py`` has torch.distributed.run start
``python -u -m pyrsia.services.nn_worker.rank_entry train.py [arguments]`` on every rank. The script runs as
``__main__`` (``runpy``, its folder first on ``sys.path``, ``sys.argv`` its own), as
``python train.py`` would run it, with three differences:

- the ``shared`` loggers (registry waits, Redis trouble) print to stderr, tagged
  ``nn_worker/<rank>``, so a rank waiting for a service says so every few seconds;
- on a pipe (honcho, ``persia-launcher run``, a log file) a progress bar comes out as a line
  per update (``pyrsia.shared.progress_lines``), not all at once when it closes;
- an exception leaving the script ends the rank with one line ``error: nn_worker/<rank>: ...``
  (``pyrsia/shared/failure_report.py``): a known error (a bad config, Redis unreachable, a
  service that never registered) with exit code 2 and its traceback in the rank's log file
  (on stderr too with ``--verbose``, ``PERSIA_VERBOSE=1`` or ``LOG_LEVEL=debug``); any other
  with exit code 1, after the script's own traceback.
"""

from __future__ import annotations

import logging
import os
import runpy
import signal
import sys
from pathlib import Path

from pyrsia.shared.cli import fail_known
from pyrsia.shared.constants import ENV_PROCESS, ENV_RANK_AGENT_PID
from pyrsia.shared.parent_death import die_with_parent, orphaned
from pyrsia.shared.process_env import export
from pyrsia.shared.progress_lines import progress_lines_when_piped
from pyrsia.shared.redaction import redacting_formatter
from pyrsia.shared.settings import current

_FORMAT = "%(asctime)s %(levelname)s [{tag}] %(name)s: %(message)s"


def _show_service_logs(tag: str, log_level: str) -> None:
    """The ``pyrsia`` loggers to stderr at ``LOG_LEVEL`` (default INFO), apart from the root
    logger, which stays the user script's to configure."""
    logger = logging.getLogger("pyrsia")
    if logger.handlers:
        return
    level = logging.getLevelName(log_level.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(redacting_formatter(_FORMAT.format(tag=tag)))
    logger.addHandler(handler)
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(
            "usage: python -m pyrsia.services.nn_worker.rank_entry train.py [arguments]",
            file=sys.stderr,
        )
        return 2
    script = Path(argv[0])
    # killed -9, torch's agent cannot forward SIGTERM: the kernel does (TrainCtx drains)
    die_with_parent(signal.SIGTERM)
    settings = current()
    if orphaned(int(settings.text(ENV_RANK_AGENT_PID, str(os.getppid())))):
        return 143  # the agent died before the request above: as if SIGTERM came
    progress_lines_when_piped()  # a tqdm bar on a pipe (honcho, run): a line per update
    process = f"nn_worker/{settings.text('RANK', '0')}"
    export({ENV_PROCESS: process})  # for the script's contexts and its children
    _show_service_logs(process, settings.log_level)
    sys.argv = [str(script), *argv[1:]]
    sys.path[0] = str(script.parent.resolve())  # where `python train.py` looks first
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Exception as exc:  # one line naming this rank (SystemExit passes)
        return fail_known(exc, settings.with_values({ENV_PROCESS: process}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
