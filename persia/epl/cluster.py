"""``cluster.*``: applied where a single-node torch job has a meaning, else logged once.

- ``cluster.run_visible_devices`` ("0,1") sets ``CUDA_VISIBLE_DEVICES`` for this
  process, so it must be applied before CUDA is first used (``epl.init`` does it).
- ``cluster.device_place_prefer_intra_node`` and ``cluster.colocate_split_and_replicate``
  place EPL TaskGraphs on devices; a Pyrsia NN-worker rank holds its whole dense model
  on one device, so they have no effect: when set explicitly, that is logged once.
"""

from __future__ import annotations

import logging

import torch

from persia.epl.config import KEYS, Config
from pyrsia.shared.process_env import replace

log = logging.getLogger(__name__)

NO_EFFECT_KEYS = ("cluster.device_place_prefer_intra_node", "cluster.colocate_split_and_replicate")
_logged: set[str] = set()


def apply_cluster_config(config: Config) -> list[str]:
    """Apply the cluster keys of ``config``; returns the keys reported as having no effect."""
    devices = config.get("cluster.run_visible_devices")
    if devices:
        previous = replace("CUDA_VISIBLE_DEVICES", devices)
        if previous != devices:
            if torch.cuda.is_initialized():
                log.warning(
                    "cluster.run_visible_devices=%r: CUDA is already initialized in this process, "
                    "so CUDA_VISIBLE_DEVICES only reaches child processes; call epl.init() first",
                    devices,
                )
            log.info("cluster.run_visible_devices: CUDA_VISIBLE_DEVICES=%s", devices)
    ignored = []
    for key in NO_EFFECT_KEYS:
        if config.get(key) != KEYS[key].default:
            ignored.append(key)
            if key not in _logged:
                _logged.add(key)
                log.warning(
                    "%s=%r has no effect in Pyrsia: each NN-worker rank holds its whole dense "
                    "model on one device (EPL uses it to place TaskGraphs)",
                    key,
                    config.get(key),
                )
    return ignored
