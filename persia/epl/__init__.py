"""EPL's training options for the NN worker's dense model (Alibaba EasyParallelLibrary).

::

    import persia.epl as epl
    config = epl.Config({"pipeline.num_micro_batch": 4, "amp.level": "O1"})
    epl.init(config)                      # or TrainCtx(..., epl_config=config)
    with TrainCtx(...) as ctx: ...

Modules, one per feature: ``config`` (the key table), ``microbatch``, ``pipeline``,
``recompute`` (the ``gradient_checkpoint.*`` keys), ``zero``, ``offload``, ``amp``,
``optimizer``, ``communication``, ``io``, ``cluster``; ``plan`` applies them to a
``TrainCtx`` (refusing at once, with the key and the fix, what a TrainCtx cannot honour,
and warning about keys it does not read): importing ``persia.epl`` registers it as the
``TrainCtx(epl_config=...)`` extension (:mod:`persia._train_parts`), so ``TrainCtx``
never imports EPL; ``buffers`` keeps BatchNorm statistics to one update per sample when a pass is
recomputed (micro-batches, gradient checkpoint).
"""

from persia._train_parts import register_train_extension
from persia.epl.config import KEYS, Config
from persia.epl.io import FileListDataset, slice_files
from persia.epl.plan import install_plan
from persia.epl.recompute import add_to_collection
from persia.epl.state import clip_by_global_norm, current_config, init

register_train_extension("epl_config", install_plan)

__all__ = [
    "KEYS",
    "Config",
    "FileListDataset",
    "add_to_collection",
    "clip_by_global_norm",
    "current_config",
    "init",
    "slice_files",
]
