"""Whether this job runs in embedded mode: ``$PERSIA_EMBEDDED`` read and checked.

A module of its own, with no engine imports, so ``persia-launcher run`` and the contexts can
ask without loading the embedding engines (pyrsia/services/embedded/job.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyrsia.shared.constants import ENV_EMBEDDED
from pyrsia.shared.errors import ConfigError

TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("", "0", "false", "no", "off")


def embedded_requested(environ: Mapping[str, str]) -> bool:
    """Whether ``$PERSIA_EMBEDDED`` of ``environ`` (the caller's settings) asks for embedded mode: 1, true, yes or on (any case);
    unset, empty, 0, false, no or off is services mode; any other value is a ConfigError
    naming the variable and what it accepts."""
    value = environ.get(ENV_EMBEDDED, "")
    text = value.strip().lower()
    if text in TRUE_VALUES:
        return True
    if text in FALSE_VALUES:
        return False
    raise ConfigError(
        f"${ENV_EMBEDDED}={value!r}: expected 1 (embedded mode: the whole job in one process) "
        "or 0 / unset (services mode)"
    )
