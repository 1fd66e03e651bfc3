"""The NN worker's loop thread runs in the background CPU class while a services-mode session
is open, as embedded mode's engine threads do: the training threads keep the cores, the loop
takes one when they leave it (``docs/guides/scaling.md``)."""

from __future__ import annotations

import os

import pytest

from pyrsia.services.nn_worker.session import Session
from pyrsia.shared.constants import ENV_CPU_PRIORITY
from pyrsia.shared.runtime import get_runtime
from pyrsia.shared.settings import Settings
from tests.redis_server import free_port

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")


def _open(environ: dict[str, str] | None = None) -> Session:
    settings = Settings.from_env(environ if environ is not None else {})
    return Session.open(settings, addresses=[f"127.0.0.1:{free_port()}"])


def test_the_loop_thread_is_in_the_idle_class_from_the_first_open_session_to_the_last_close():
    loop_thread = get_runtime(Settings.from_env({})).native_id
    assert os.sched_getscheduler(loop_thread) == os.SCHED_OTHER
    training = _open()
    assert training.runtime.native_id == loop_thread
    assert os.sched_getscheduler(loop_thread) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the training thread keeps its class
    evaluation = _open()
    evaluation.close()
    evaluation.close()  # closing twice counts once
    assert os.sched_getscheduler(loop_thread) == os.SCHED_IDLE
    training.close()
    assert os.sched_getscheduler(loop_thread) == os.SCHED_OTHER


def test_persia_cpu_priority_normal_keeps_the_loop_thread_in_the_default_class():
    session = _open({ENV_CPU_PRIORITY: "normal"})
    try:
        assert os.sched_getscheduler(session.runtime.native_id) == os.SCHED_OTHER
    finally:
        session.close()
