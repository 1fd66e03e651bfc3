"""The NN worker's loop thread runs in the background CPU class while a services-mode training
loop runs, as embedded mode's engine threads do while its session is open: the training
threads keep the cores, the loop takes one when they leave it (``docs/guides/scaling.md``).
It waits for the process's kernel warm-up, whose compilation would otherwise leave the loop no
CPU for its registry heartbeat."""

from __future__ import annotations

import os
import threading

import pytest

from pyrsia.services.nn_worker.session import Session, TrainingLoopClass
from pyrsia.shared.constants import ENV_CPU_PRIORITY
from pyrsia.shared.settings import Settings
from pyrsia.shared.warming import warm_in_background, warming_in_progress
from tests.redis_server import free_port

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")


def _open(environ: dict[str, str] | None = None) -> Session:
    settings = Settings.from_env(environ if environ is not None else {})
    return Session.open(settings, addresses=[f"127.0.0.1:{free_port()}"])


def _policy(session: Session) -> int:
    return os.sched_getscheduler(session.runtime.native_id)


def test_the_loop_thread_is_in_the_idle_class_from_the_first_training_loop_to_the_last_end():
    session = _open()
    try:
        assert _policy(session) == os.SCHED_OTHER  # an open session alone changes nothing
        training, another = TrainingLoopClass(session), TrainingLoopClass(session)
        training.settle()
        assert _policy(session) == os.SCHED_IDLE
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the training thread keeps its class
        another.settle()
        another.release()
        another.release()  # releasing twice counts once
        assert _policy(session) == os.SCHED_IDLE
        training.settle()  # each batch settles: still one hold
        training.release()
        assert _policy(session) == os.SCHED_OTHER
    finally:
        session.close()


def test_the_loop_thread_keeps_the_default_class_while_a_kernel_warm_up_runs():
    session = _open()
    go = threading.Event()
    warm_up = warm_in_background(lambda: go.wait(30), "test")
    loop = TrainingLoopClass(session)
    try:
        assert warming_in_progress()
        loop.settle()
        assert _policy(session) == os.SCHED_OTHER
        go.set()
        warm_up.join(30)
        loop.settle()
        assert _policy(session) == os.SCHED_IDLE
    finally:
        go.set()
        loop.release()
        session.close()
    assert _policy(session) == os.SCHED_OTHER


def test_persia_cpu_priority_normal_keeps_the_loop_thread_in_the_default_class():
    session = _open({ENV_CPU_PRIORITY: "normal"})
    loop = TrainingLoopClass(session)
    try:
        loop.settle()
        assert _policy(session) == os.SCHED_OTHER
    finally:
        loop.release()
        session.close()
