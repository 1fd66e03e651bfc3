"""``hb.context.options``: HybridBackend's global, typed options.

Every option has a type, a default, a validator, and (for the ones that make sense
in a shell) an environment variable ``HB_<NAME>`` that supplies the default::

    hb.context.options.grad_nbuckets = 2        # in the script
    HB_GRAD_NBUCKETS=2 python train.py          # or from the environment

    name                  type   default  env                    meaning
    grad_nbuckets         int    1        HB_GRAD_NBUCKETS       all-reduces per step of the dense gradients
    grad_lazy_sync        bool   False    HB_GRAD_LAZY_SYNC      all-reduce in optimizer.step(), not during backward
    find_unused_parameters bool  False    HB_FIND_UNUSED_PARAMETERS  DDP's flag of the same name
    comm_default          str    auto     HB_COMM_DEFAULT        process-group backend: auto, nccl or gloo
    data_sync_drop_remainder bool True    HB_DATA_SYNC_DROP_REMAINDER  every rank gets the same number of batches
    sharding              bool   False    HB_SHARDING            place torch embeddings on the embedding PS
    emb_grad_reduction    str    mean     HB_EMB_GRAD_REDUCTION  sharded embeddings' gradients over the ranks:
                                                                 mean (HybridBackend's) or sum (PERSIA's)
    emb_staleness         int    10       HB_EMB_STALENESS       embedding-gradient sends in flight (0: wait for each)
    batch_size            int    -1       HB_BATCH_SIZE          default batch size of hb.data iterators
    seed                  int    -1       HB_SEED                seed of hb.data shuffling (-1: no shuffle)
    embedding_optimizer   persia.embedding.optim.Optimizer | None   (no env)
    embedding_config      persia.embedding.EmbeddingConfig | None   (no env)

``grad_nbuckets`` and ``grad_lazy_sync`` take the value in effect where the model or
optimizer is made or wrapped (inside ``hb.scope(grad_nbuckets=2)``: 2, also for steps
taken after the block), as HybridBackend reads them when it wraps an optimizer.

The options are a key table of the option engine (``pyrsia.shared.options``). An unknown
name is refused with the closest known one (``grad_nbucket`` -> ``(did you mean
"grad_nbuckets"?)``) as an ``UnknownOptionError``, also an ``AttributeError`` as in
HybridBackend; a wrong type or value is an ``OptionError`` (a ``ValueError``) naming the
option and what was expected. Environment variables are read when the options object is
created (first use of ``hb.context``), not at import, and :meth:`Options.reload_env`
reads them again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from persia.embedding import EmbeddingConfig
from persia.embedding.optim import Optimizer as EmbeddingOptimizer
from pyrsia.shared.options import Boolean, Choice, InstanceOf, Integer, Key, KeyTable, Nullable
from pyrsia.shared.settings import current

ENV_PREFIX = "HB_"
COMM_BACKENDS = ("auto", "nccl", "gloo")
EMB_GRAD_REDUCTIONS = ("mean", "sum")

OptionSpec = Key
"""One option (:class:`pyrsia.shared.options.Key`): kind, default, ``HB_<NAME>`` variable, doc."""


def _option(name: str, kind: Any, default: Any, doc: str, *, env: bool = True) -> Key:
    return Key(name, kind, default, env=ENV_PREFIX + name.upper() if env else None, doc=doc)


SPECS: dict[str, Key] = {
    spec.name: spec
    for spec in (
        _option(
            "grad_nbuckets", Integer(1), 1, "number of all-reduce buckets of the dense gradients"
        ),
        _option(
            "grad_lazy_sync",
            Boolean(),
            False,
            "all-reduce dense gradients in optimizer.step() instead of during backward",
        ),
        _option(
            "find_unused_parameters",
            Boolean(),
            False,
            "DistributedDataParallel's find_unused_parameters",
        ),
        _option(
            "comm_default",
            Choice(*COMM_BACKENDS, ignore_case=False),
            "auto",
            "torch.distributed backend",
        ),
        _option(
            "data_sync_drop_remainder",
            Boolean(),
            True,
            "every rank's iterator yields the same number of batches",
        ),
        _option(
            "sharding",
            Boolean(),
            False,
            "torch.nn.Embedding/EmbeddingBag created in hb.scope live on the embedding PS",
        ),
        _option(
            "emb_staleness",
            Integer(0),
            10,
            "embedding-gradient sends in flight per process (0: each send is awaited)",
        ),
        _option(
            "emb_grad_reduction",
            Choice(*EMB_GRAD_REDUCTIONS, ignore_case=False),
            "mean",
            "how the ranks' gradients of sharded embeddings combine on the PS",
        ),
        _option(
            "batch_size", Integer(1, sentinel=-1), -1, "default batch size of hb.data iterators"
        ),
        _option(
            "seed",
            Integer(0, sentinel=-1),
            -1,
            "shuffle seed of hb.data iterators (-1: keep the dataset order)",
        ),
        _option(
            "embedding_optimizer",
            Nullable(
                InstanceOf(
                    EmbeddingOptimizer, "a persia.embedding.optim optimizer (SGD, Adam, Adagrad)"
                )
            ),
            None,
            "optimizer the embedding PS applies",
            env=False,
        ),
        _option(
            "embedding_config",
            Nullable(InstanceOf(EmbeddingConfig, "a persia.embedding.EmbeddingConfig")),
            None,
            "initialization / admission / weight bound of the PS embeddings",
            env=False,
        ),
    )
}
"""Every option by name, in the order of the table above."""

TABLE = KeyTable(
    SPECS.values(),
    subject="hb.context.options",
    where=lambda name: f"hb.context.options.{name}",
    noun="option",
    list_known=True,
)


class Options:
    """The option values of this process: attribute access, validated on every write."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        object.__setattr__(self, "_lock", threading.RLock())
        object.__setattr__(self, "_values", {})
        self.reload_env(environ)

    def reload_env(self, environ: dict[str, str] | None = None) -> None:
        """Reset every option to its default, taken from ``HB_<NAME>`` when set."""
        values, _ = TABLE.resolve({}, current().environ if environ is None else environ)
        with self._lock:
            self._values.clear()
            self._values.update(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = object.__getattribute__(self, "_values")
        if name not in values:
            raise TABLE.unknown(name)
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        checked = TABLE.check(name, value)
        with self._lock:
            self._values[name] = checked

    def validate(self, **values: Any) -> None:
        """Check names and values without setting anything."""
        for name, value in values.items():
            TABLE.check(name, value)

    def update(self, **values: Any) -> dict[str, Any]:
        """Set several options at once (all validated first); returns the previous values."""
        self.validate(**values)
        with self._lock:
            previous = {name: self._values[name] for name in values}
            self._values.update(values)
        return previous

    @contextmanager
    def scoped(self, **values: Any) -> Iterator[Options]:
        """Set options for a block and restore the previous values after it."""
        previous = self.update(**values)
        try:
            yield self
        finally:
            with self._lock:
                self._values.update(previous)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._values)

    def __dir__(self) -> list[str]:
        return sorted(SPECS)

    def __repr__(self) -> str:
        return f"Options({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"
