"""EPL reaches TrainCtx only through the extension slot of ``persia._train_parts``:
``persia.ctx`` loads no EPL module, and a TrainCtx adopts the parts EPL returns."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from persia._train_parts import TrainParts, apply_train_extension
from pyrsia.services.nn_worker.precision import Precision
from tests.nn_helpers import SmallModel

WITHOUT_EPL = textwrap.dedent(
    """
    import sys
    import torch
    from persia.ctx import TrainCtx
    from persia.embedding.optim import SGD
    from pyrsia.shared.errors import InvalidInputError
    assert not [m for m in sys.modules if m.startswith("persia.epl")], "persia.ctx loaded EPL"
    model = torch.nn.Linear(2, 1)
    assert TrainCtx(SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                    mixed_precision=False).epl_plan is None
    try:
        TrainCtx(SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model,
                 epl_config={"amp.level": "O1"})
    except InvalidInputError as error:
        assert "epl_config" in str(error) and "persia.epl.Config" in str(error), error
    else:
        raise AssertionError("a dict as epl_config was accepted")
    """
)


def test_persia_ctx_loads_no_epl_and_refuses_epl_options_without_it():
    run = subprocess.run([sys.executable, "-c", WITHOUT_EPL], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


def test_epl_returns_new_parts_and_leaves_the_given_ones_alone():
    from persia.epl import Config
    from persia.epl.optimizer import GroupedApplyOptimizer

    model = SmallModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    parts = TrainParts(model, optimizer, None, Precision(False, None), None)
    config = Config({"optimizer.num_apply_group": 2, "amp.level": "O1"}, environ={})
    plan, new = apply_train_extension("epl_config", parts, config, "a persia.epl.Config")
    assert plan is not None and plan.config is config
    assert isinstance(new.dense_optimizer, GroupedApplyOptimizer)
    assert type(new.precision).__name__ == "EplPrecision"
    assert type(new.distributed_option).__name__ == "EplDistributedOption"
    assert parts.dense_optimizer is optimizer and type(parts.precision) is Precision
    assert apply_train_extension("epl_config", parts, None, "-") == (None, parts)
