"""Data-parallel training of the dense model across NN-worker ranks (PERSIA's API).

``TrainCtx`` wraps the model with one of these options when ``WORLD_SIZE > 1``:

- :class:`DDPOption` — PyTorch DistributedDataParallel; ``nccl`` on GPUs, ``gloo`` on CPUs.
- :class:`BaguaDistributedOption` — Bagua, when it is installed and CUDA is present.

:func:`get_default_distributed_option` picks DDP with nccl when a GPU is used and gloo
otherwise. When no master address is given, rank 0 publishes its own through the
Redis registry and the other ranks read it there (``TrainCtx`` does that).
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch.distributed.constants import default_pg_timeout

from pyrsia.shared.errors import ConfigError, InvalidInputError
from pyrsia.shared.process_env import export, prepend_path

__all__ = [
    "BaguaDistributedOption",
    "DDPOption",
    "DistributedBaseOption",
    "get_default_distributed_option",
]

_logger = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 23456
_INIT_METHODS = ("tcp", "file")
_BACKENDS = ("nccl", "gloo")


def _check_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidInputError("master_port", "an integer in [1, 65535]", port)
    return port


class DistributedBaseOption(ABC):
    """Common part of the distributed options: where the rendezvous master is."""

    def __init__(self, master_port: int = DEFAULT_MASTER_PORT, master_addr: str | None = None):
        self.master_port = _check_port(master_port)
        if master_addr is not None and (not isinstance(master_addr, str) or not master_addr):
            raise InvalidInputError("master_addr", "a host name or IP address", master_addr)
        self.master_addr = master_addr

    @abstractmethod
    def convert2distributed_model(
        self,
        model: torch.nn.Module,
        world_size: int,
        rank_id: int,
        device_id: int | None = None,
        master_addr: str | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """Join the process group and return the data-parallel model and its optimizer."""

    @abstractmethod
    def init_with_env_file(self) -> bool:
        """True when the rendezvous needs no master address (a shared sync file)."""

    def needs_master_addr(self) -> bool:
        """True when ``TrainCtx`` must find the master address (none given, no sync file)."""
        return not self.init_with_env_file() and not self.master_addr


class DDPOption(DistributedBaseOption):
    """PyTorch DistributedDataParallel.

    Arguments:
        initialization_method: ``"tcp"`` (rendezvous at master_addr:master_port) or
            ``"file"`` (a shared ``sync_file``). ``init_method`` is accepted as well.
        backend: ``"nccl"`` (GPUs) or ``"gloo"`` (CPUs).
        options: ``master_addr``, ``master_port`` (23456), ``sync_file`` (for "file"),
            ``find_unused_parameters`` (True, as PERSIA: a model whose forward skips some
            parameters, e.g. an unused embedding slot, trains without DDP's "expected to
            have finished reduction" error; pass False to save DDP's per-step graph walk).
            Any other key is an error.
    """

    def __init__(self, initialization_method: str = "tcp", backend: str = "nccl", **options: Any):
        if "init_method" in options:
            initialization_method = options.pop("init_method")
        master_port = options.pop("master_port", DEFAULT_MASTER_PORT)
        master_addr = options.pop("master_addr", None)
        super().__init__(master_port, master_addr)
        if initialization_method not in _INIT_METHODS:
            raise InvalidInputError(
                "initialization_method", " or ".join(_INIT_METHODS), initialization_method
            )
        if backend not in _BACKENDS:
            raise InvalidInputError("backend", " or ".join(_BACKENDS), backend)
        self.sync_file = options.pop("sync_file", None)
        find_unused = options.pop("find_unused_parameters", True)
        if not isinstance(find_unused, bool):
            raise InvalidInputError("find_unused_parameters", "True or False", find_unused)
        self.find_unused_parameters = find_unused
        if options:
            raise InvalidInputError(
                "DDPOption options",
                "master_addr, master_port, sync_file or find_unused_parameters",
                sorted(options),
            )
        if initialization_method == "file" and not self.sync_file:
            raise InvalidInputError(
                "sync_file", 'a file path when initialization_method="file"', None
            )
        self.initialization_method = initialization_method
        self.backend = backend

    @property
    def init_method(self) -> str:
        """PERSIA's other spelling of :attr:`initialization_method`."""
        return self.initialization_method

    def init_with_env_file(self) -> bool:
        return self.initialization_method == "file"

    def init_url(self, master_addr: str | None = None) -> str:
        """The ``init_method`` URL for ``torch.distributed.init_process_group``."""
        if self.initialization_method == "file":
            return f"file://{os.path.abspath(self.sync_file)}"
        addr = self.master_addr or master_addr
        if not addr:
            raise ConfigError(
                "DDPOption: no master address: pass master_addr=... or let TrainCtx find it "
                "through the registry (PERSIA_REDIS_URL)"
            )
        return f"tcp://{addr}:{self.master_port}"

    def convert2distributed_model(
        self,
        model: torch.nn.Module,
        world_size: int,
        rank_id: int,
        device_id: int | None = None,
        master_addr: str | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        self.init_process_group(world_size, rank_id, device_id, master_addr)
        device_ids = [device_id] if device_id is not None else None
        parallel = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            output_device=device_id,
            find_unused_parameters=self.find_unused_parameters,
        )
        return parallel, optimizer

    def init_process_group(
        self, world_size: int, rank_id: int, device_id: int | None, master_addr: str | None
    ) -> None:
        """Join the torch.distributed process group (once per process)."""
        if self.backend == "nccl" and (device_id is None or not torch.cuda.is_available()):
            raise ConfigError(
                'DDPOption(backend="nccl") needs a CUDA device (device_id); use backend="gloo" '
                "to train on CPUs"
            )
        if not torch.distributed.is_initialized():
            url = self.init_url(master_addr)
            if self.initialization_method == "file":
                torch.distributed.init_process_group(
                    self.backend, init_method=url, rank=rank_id, world_size=world_size
                )
            else:
                # rank 0 hosts the store on its own master port, listening on the address it
                # published only (torch's tcp:// store would listen on every interface)
                from pyrsia.services.nn_worker.rendezvous import bound_tcp_store

                store = bound_tcp_store(
                    self.master_addr or master_addr,
                    self.master_port,
                    world_size,
                    rank_id == 0,
                    default_pg_timeout,
                    multi_tenant=True,
                )
                torch.distributed.init_process_group(
                    self.backend, store=store, rank=rank_id, world_size=world_size
                )
            _logger.info(
                "torch.distributed process group ready (%s, rank %d/%d)",
                self.backend,
                rank_id,
                world_size,
            )

    def __repr__(self) -> str:
        return (
            f"DDPOption(initialization_method={self.initialization_method!r}, backend={self.backend!r}, "
            f"master_addr={self.master_addr!r}, master_port={self.master_port})"
        )


# PERSIA's Bagua options that become Bagua environment variables: option -> (variable, default).
BAGUA_ENV_OPTIONS: dict[str, tuple[str, Any]] = {
    "default_bucket_size": ("BAGUA_DEFAULT_BUCKET_SIZE", 10 * 1024**2),
    "autotune_level": ("BAGUA_AUTOTUNE", 0),
    "bagua_service_port": ("BAGUA_SERVICE_PORT", 29501),
    "autotune_max_samples": ("BAGUA_AUTOTUNE_MAX_SAMPLES", 60),
    "autotune_warmup_time": ("BAGUA_AUTOTUNE_WARMUP_TIME_S", 30),
    "is_output_autotune_log": ("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", False),
    "autotune_sampling_confidence_time": ("BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S", 5.0),
}
# Keyword arguments each Bagua algorithm (or, for qadam, its optimizer) takes.
BAGUA_ALGORITHM_OPTIONS: dict[str, tuple[str, ...]] = {
    "gradient_allreduce": ("hierarchical", "average"),
    "bytegrad": ("hierarchical", "average"),
    "decentralized": ("hierarchical", "peer_selection_mode", "communication_interval"),
    "low_precision_decentralized": ("hierarchical", "communication_interval"),
    "async": ("peer_selection_mode", "sync_interval_ms", "warmup_steps"),
    "qadam": ("lr", "warmup_steps", "betas", "eps", "weight_decay", "hierarchical"),
}


class BaguaDistributedOption(DistributedBaseOption):
    """Bagua data parallelism (``algorithm`` such as ``"gradient_allreduce"``).

    Every option reaches Bagua or is refused when the option is built, never dropped:
    ``master_addr``/``master_port``; PERSIA's environment options (``default_bucket_size``,
    ``autotune_level``, ``bagua_service_port``, ``autotune_max_samples``,
    ``autotune_warmup_time``, ``is_output_autotune_log``,
    ``autotune_sampling_confidence_time``) become ``BAGUA_*`` variables;
    ``enable_bagua_net`` puts Bagua-Net on ``LD_LIBRARY_PATH``; the algorithm's own keyword
    arguments (:data:`BAGUA_ALGORITHM_OPTIONS`) go to the algorithm (for ``qadam``,
    ``lr``/``warmup_steps``/``betas``/``eps``/``weight_decay`` go to ``QAdamOptimizer`` and
    ``hierarchical`` to ``QAdamAlgorithm``). Any other key is an InvalidInputError.

    Bagua needs CUDA and the ``bagua`` package; without them converting the model raises
    a ConfigError saying so.
    """

    ALGORITHMS = tuple(BAGUA_ALGORITHM_OPTIONS)

    def __init__(self, algorithm: str, **options: Any):
        master_port = options.pop("master_port", DEFAULT_MASTER_PORT)
        master_addr = options.pop("master_addr", None)
        super().__init__(master_port, master_addr)
        if algorithm not in BAGUA_ALGORITHM_OPTIONS:
            raise InvalidInputError("algorithm", " or ".join(self.ALGORITHMS), algorithm)
        self.algorithm = algorithm
        self.env_options = {k: options.pop(k) for k in list(options) if k in BAGUA_ENV_OPTIONS}
        self.enable_bagua_net = bool(options.pop("enable_bagua_net", False))
        allowed = BAGUA_ALGORITHM_OPTIONS[algorithm]
        unknown = sorted(k for k in options if k not in allowed)
        if unknown:
            raise InvalidInputError(
                f"BaguaDistributedOption({algorithm!r}) options",
                "master_addr, master_port, enable_bagua_net, "
                + ", ".join([*BAGUA_ENV_OPTIONS, *allowed]),
                unknown,
            )
        self.options = options

    def init_with_env_file(self) -> bool:
        return False

    def bagua_environment(self, master_addr: str | None = None) -> dict[str, str]:
        """The environment variables Bagua reads, from this option's settings."""
        variables = {
            "MASTER_ADDR": self.master_addr or master_addr or "127.0.0.1",
            "MASTER_PORT": str(self.master_port),
        }
        for key, (name, default) in BAGUA_ENV_OPTIONS.items():
            value = self.env_options.get(key, default)
            variables[name] = str(int(value)) if isinstance(value, bool) else str(value)
        if int(variables["BAGUA_AUTOTUNE"]) > 0:
            variables["AUTO_TUNE_SERVER_ADDR"] = (
                f"{variables['MASTER_ADDR']}:{variables['BAGUA_SERVICE_PORT']}"
            )
        return variables

    def convert2distributed_model(
        self,
        model: torch.nn.Module,
        world_size: int,
        rank_id: int,
        device_id: int | None = None,
        master_addr: str | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        if not torch.cuda.is_available() or device_id is None:
            raise ConfigError(
                "BaguaDistributedOption needs CUDA and a device_id; on CPUs use DDPOption(backend='gloo')"
            )
        try:
            import bagua.torch_api as bagua_api  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ConfigError(
                "BaguaDistributedOption needs the bagua package (pip install bagua-cuda11x); "
                "or use DDPOption"
            ) from exc
        export(self.bagua_environment(master_addr))
        if self.enable_bagua_net:
            import importlib.resources

            net = importlib.resources.files("bagua_core") / "data" / "bagua-net"
            prepend_path("LD_LIBRARY_PATH", str(net))
        bagua_api.init_process_group()
        algorithm, optimizer = self._algorithm(bagua_api.algorithms, model, optimizer)
        return model.with_bagua([optimizer], algorithm), optimizer

    def _algorithm(self, algorithms, model: torch.nn.Module, optimizer):
        kw = self.options
        if self.algorithm == "qadam":
            opt_kw = {k: v for k, v in kw.items() if k != "hierarchical"}
            optimizer = algorithms.q_adam.QAdamOptimizer(model.parameters(), **opt_kw)
            algo_kw = {k: v for k, v in kw.items() if k == "hierarchical"}
            return algorithms.q_adam.QAdamAlgorithm(optimizer, **algo_kw), optimizer
        factories = {
            "gradient_allreduce": lambda: algorithms.gradient_allreduce.GradientAllReduceAlgorithm,
            "decentralized": lambda: algorithms.decentralized.DecentralizedAlgorithm,
            "low_precision_decentralized": lambda: (
                algorithms.decentralized.LowPrecisionDecentralizedAlgorithm
            ),
            "bytegrad": lambda: algorithms.bytegrad.ByteGradAlgorithm,
            "async": lambda: algorithms.async_model_average.AsyncModelAverageAlgorithm,
        }
        return factories[self.algorithm]()(**kw), optimizer


def get_default_distributed_option(device_id: int | None = None) -> DDPOption:
    """DDP with nccl when training on a GPU (``device_id`` given and CUDA present), gloo otherwise."""
    if device_id is not None and torch.cuda.is_available():
        return DDPOption(backend="nccl")
    return DDPOption(backend="gloo")
