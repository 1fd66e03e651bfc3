"""PERSIA's own unit tests (PersiaML/PERSIA test/), run unchanged against Pyrsia.

PERSIA's tests write RANK, WORLD_SIZE, EMBEDDING_WORKER_SERVICE ... into ``os.environ`` and
never undo it; here every test gets the session Redis and a job id of its own (``job_env``)
and the environment (and ``persia.env``'s cache) is restored afterwards, so they do not leak
into the rest of the suite.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _persia_test_env(job_env):
    from persia.env import reload_env

    saved = dict(os.environ)
    reload_env()
    yield
    os.environ.clear()
    os.environ.update(saved)
    reload_env()
