"""bf16 on the CPU: Pyrsia tells whether the processor computes it, and warns when it does not."""

import logging
import platform

import pytest

from pyrsia.services.nn_worker import precision
from pyrsia.services.nn_worker.precision import Precision


def _cpuinfo_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not platform.system() == "Linux",
    reason="/proc/cpuinfo flags are x86 Linux's",
)
def test_the_bf16_probe_agrees_with_the_kernels_cpu_flags():
    flags = _cpuinfo_flags()
    expected = bool({"avx512_bf16", "amx_tile"} & flags)
    assert precision.cpu_computes_bf16() is expected


@pytest.mark.parametrize("native", [True, False, None])
def test_mixed_precision_on_the_cpu_warns_only_where_bf16_is_emulated(monkeypatch, caplog, native):
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: native)
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        p = Precision(True, None)
    assert p.dtype is not None and p.device_type == "cpu"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    if native is False:
        assert len(warnings) == 1
        assert "no bf16 instructions" in warnings[0].getMessage()
        assert "mixed_precision=False" in warnings[0].getMessage()
    else:
        assert warnings == []


def test_full_precision_logs_no_bf16_warning(monkeypatch, caplog):
    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: False)
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        p = Precision(False, None)
    assert p.dtype is None and caplog.records == []


@pytest.mark.parametrize("native", [True, False])
def test_epl_amp_o1_on_the_cpu_warns_only_where_bf16_is_emulated(monkeypatch, caplog, native):
    from persia.epl.amp import EplPrecision
    from persia.epl.config import Config

    monkeypatch.setattr(precision, "cpu_computes_bf16", lambda: native)
    with caplog.at_level(logging.INFO):
        p = EplPrecision(Config({"amp.level": "O1"}), None, Precision(False, None))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert p.device_type == "cpu" and p.scaler is None
    assert len(warnings) == (0 if native else 1)
    if not native:
        assert "amp.level O1" in warnings[0] and "no bf16 instructions" in warnings[0]


def test_a_loss_scaler_shrinks_on_non_finite_embedding_gradients_and_keeps_it_otherwise():
    """The scale is read only when it must shrink (on a GPU each read waits for the
    device); the step and the update still happen on every step."""
    import torch

    p = Precision(False, None)
    p.scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=1000)
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    for finite, want_scale in ((True, 64.0), (False, 32.0), (True, 32.0)):
        (p.scaler.scale(weight.sum())).backward()
        p.step(optimizer, finite, shrink_factor=2.0)
        optimizer.zero_grad()
        assert p.scaler.get_scale() == want_scale
    assert weight.tolist() == [-0.5] * 3  # three unscaled steps of lr 0.5 x gradient 1
