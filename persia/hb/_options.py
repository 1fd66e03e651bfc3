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

An unknown name is refused with the closest known one (``grad_nbucket`` ->
``did you mean 'grad_nbuckets'?``); a wrong type or value names the option and
what was expected. Environment variables are read when the options object is
created (first use of ``hb.context``), not at import, and :meth:`Options.reload_env`
reads them again.
"""

from __future__ import annotations

import difflib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from persia.embedding import EmbeddingConfig
from persia.embedding.optim import Optimizer as EmbeddingOptimizer
from pyrsia.shared.errors import ConfigError, InvalidInputError

ENV_PREFIX = "HB_"
COMM_BACKENDS = ("auto", "nccl", "gloo")
EMB_GRAD_REDUCTIONS = ("mean", "sum")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class OptionSpec:
    """One option: its type (for messages and env parsing), default and validation."""

    name: str
    kind: type | tuple[type, ...]
    default: Any
    expected: str
    check: Callable[[Any], bool]
    env: bool = True
    doc: str = ""

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def validate(self, value: Any, source: str) -> Any:
        ok_type = isinstance(value, self.kind) and not (
            isinstance(value, bool) and self.kind in (int, (int,))
        )
        if value is None and self.default is None:
            return None
        if not ok_type or not self.check(value):
            raise InvalidInputError(source, self.expected, value)
        return value

    def parse_env(self, raw: str) -> Any:
        text = raw.strip()
        source = f"environment variable {self.env_name}"
        if self.kind is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ConfigError(f"{source}: expected {self.expected} (1/0, true/false), got {raw!r}")
        if self.kind is int:
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(f"{source}: expected {self.expected}, got {raw!r}") from None
            try:
                return self.validate(value, source)
            except InvalidInputError as exc:
                raise ConfigError(str(exc)) from None
        try:
            return self.validate(text.lower(), source)
        except InvalidInputError as exc:
            raise ConfigError(str(exc)) from None


def _int_at_least(minimum: int) -> Callable[[Any], bool]:
    return lambda v: v >= minimum


SPECS: dict[str, OptionSpec] = {
    spec.name: spec
    for spec in (
        OptionSpec("grad_nbuckets", int, 1, "an integer >= 1", _int_at_least(1),
                   doc="number of all-reduce buckets of the dense gradients"),
        OptionSpec("grad_lazy_sync", bool, False, "a bool", lambda v: True,
                   doc="all-reduce dense gradients in optimizer.step() instead of during backward"),
        OptionSpec("find_unused_parameters", bool, False, "a bool", lambda v: True,
                   doc="DistributedDataParallel's find_unused_parameters"),
        OptionSpec("comm_default", str, "auto", "one of auto, nccl, gloo",
                   lambda v: v in COMM_BACKENDS, doc="torch.distributed backend"),
        OptionSpec("data_sync_drop_remainder", bool, True, "a bool", lambda v: True,
                   doc="every rank's iterator yields the same number of batches"),
        OptionSpec("sharding", bool, False, "a bool", lambda v: True,
                   doc="torch.nn.Embedding/EmbeddingBag created in hb.scope live on the embedding PS"),
        OptionSpec("emb_staleness", int, 10, "an integer >= 0", _int_at_least(0),
                   doc="embedding-gradient sends in flight per process (0: each send is awaited)"),
        OptionSpec("emb_grad_reduction", str, "mean", "one of mean, sum",
                   lambda v: v in EMB_GRAD_REDUCTIONS,
                   doc="how the ranks' gradients of sharded embeddings combine on the PS"),
        OptionSpec("batch_size", int, -1, "-1 or an integer >= 1", lambda v: v == -1 or v >= 1,
                   doc="default batch size of hb.data iterators"),
        OptionSpec("seed", int, -1, "-1 or an integer >= 0", _int_at_least(-1),
                   doc="shuffle seed of hb.data iterators (-1: keep the dataset order)"),
        OptionSpec("embedding_optimizer", EmbeddingOptimizer, None,
                   "a persia.embedding.optim optimizer (SGD, Adam, Adagrad) or None",
                   lambda v: True, env=False, doc="optimizer the embedding PS applies"),
        OptionSpec("embedding_config", EmbeddingConfig, None,
                   "a persia.embedding.EmbeddingConfig or None", lambda v: True, env=False,
                   doc="initialization / admission / weight bound of the PS embeddings"),
    )
}  # fmt: skip


def _unknown(name: str) -> AttributeError:
    close = difflib.get_close_matches(name, list(SPECS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known options: {', '.join(SPECS)}"
    return AttributeError(f"hb.context.options has no option {name!r}{hint}")


class Options:
    """The option values of this process: attribute access, validated on every write."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        object.__setattr__(self, "_lock", threading.RLock())
        object.__setattr__(self, "_values", {})
        self.reload_env(environ)

    def reload_env(self, environ: dict[str, str] | None = None) -> None:
        """Reset every option to its default, taken from ``HB_<NAME>`` when set."""
        env = os.environ if environ is None else environ
        values = {}
        for name, spec in SPECS.items():
            raw = env.get(spec.env_name, "") if spec.env else ""
            values[name] = spec.parse_env(raw) if raw.strip() else spec.default
        with self._lock:
            self._values.clear()
            self._values.update(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = object.__getattribute__(self, "_values")
        if name not in values:
            raise _unknown(name)
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in SPECS:
            raise _unknown(name)
        checked = SPECS[name].validate(value, f"hb.context.options.{name}")
        with self._lock:
            self._values[name] = checked

    def validate(self, **values: Any) -> None:
        """Check names and values without setting anything."""
        for name, value in values.items():
            if name not in SPECS:
                raise _unknown(name)
            SPECS[name].validate(value, f"hb.context.options.{name}")

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
