"""PERSIA's current Python API where it moved on (issue 49, item 5).

PERSIA's ``DataLoader`` dropped ``is_training`` from its positional arguments:
``DataLoader(dataset, forward_buffer_size=10, timeout_ms=600000, num_workers=10,
reproducible=False, embedding_staleness=None)``; Pyrsia follows it and keeps ``is_training``
as a keyword. PERSIA has a ``persia.version`` module holding ``__version__``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import persia
from persia.data import DataLoader, IterableDataset
from pyrsia.shared.errors import InvalidInputError
from tests.service_procs import REPO


def test_dataloader_takes_persias_current_positional_arguments():
    loader = DataLoader(IterableDataset(), 10, 600000)
    assert (loader.forward_buffer_size, loader.timeout_ms, loader.is_training) == (10, 600000, True)
    loader = DataLoader(IterableDataset(), 4, 1000, 3, True, 2)
    assert (loader.num_workers, loader.reproducible, loader.embedding_staleness) == (3, True, 2)


def test_dataloader_keeps_is_training_as_a_keyword():
    assert DataLoader(IterableDataset(), is_training=False).is_training is False
    with pytest.raises(InvalidInputError, match="is_training"):
        DataLoader(IterableDataset(), is_training="no")


def test_the_old_positional_is_training_is_refused_naming_timeout_ms():
    with pytest.raises(InvalidInputError, match="timeout_ms"):
        DataLoader(IterableDataset(), 10, False)


def test_persia_version_is_a_module_with_the_version():
    version = importlib.import_module("persia.version")
    assert version.__version__ == persia.__version__
    assert persia.version is version
    out = subprocess.run(
        [sys.executable, "-c", "import persia; print(persia.version.__version__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == persia.__version__
