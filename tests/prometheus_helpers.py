"""Shared pieces of the Prometheus tests: the ``persia-launcher prometheus-targets`` command
(persia/_launch/prometheus.py) run as a subprocess, and a check of the file_sd JSON it writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.service_procs import REPO

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def run_prometheus_targets(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess:
    """``python -m persia.launcher prometheus-targets ARGS`` in the repo, ``env`` over ours."""
    return subprocess.run(
        [sys.executable, "-m", "persia.launcher", "prometheus-targets", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_file_sd(groups: object) -> None:
    """Prometheus's file_sd format: a list of {"targets": ["host:port", ...], "labels": {...}}."""
    assert isinstance(groups, list), groups
    for group in groups:
        assert set(group) <= {"targets", "labels"}, group
        assert group["targets"] and all(
            isinstance(t, str) and re.fullmatch(r"[^\s/:]+:\d+", t) for t in group["targets"]
        ), group
        labels = group.get("labels", {})
        assert all(LABEL_NAME.match(k) and not k.startswith("__") for k in labels), labels
        assert all(isinstance(v, str) for v in labels.values()), labels
