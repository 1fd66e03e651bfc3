"""Each service folder is a process: ``python -m pyrsia.services.<name>`` takes the flags of
its ``persia-launcher`` command, and its ``__init__`` says what it does and draws its threads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {
    "embedding_ps": "embedding-parameter-server",
    "embedding_worker": "embedding-worker",
    "nn_worker": "nn-worker",
    "data_loader": "data-loader",
}


def _help(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("folder", sorted(SERVICES))
def test_python_dash_m_takes_the_launcher_commands_flags(folder: str) -> None:
    module = _help("-m", f"pyrsia.services.{folder}")
    launcher = _help("-m", "persia.launcher", SERVICES[folder])
    assert module == launcher
    assert "--" in module  # a real flag list, not an empty usage line


@pytest.mark.parametrize("folder", sorted(SERVICES))
def test_each_service_folder_says_what_its_process_does_and_draws_its_threads(folder: str) -> None:
    path = ROOT / "pyrsia" / "services" / folder
    assert (path / "__main__.py").is_file()
    import importlib

    doc = importlib.import_module(f"pyrsia.services.{folder}").__doc__ or ""
    assert f"python -m pyrsia.services.{folder}" in doc
    assert "Threads of one" in doc and "::" in doc  # a literal block: the picture
