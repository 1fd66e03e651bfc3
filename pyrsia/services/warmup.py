"""``python -m pyrsia.services.warmup``: load (or compile) every numba kernel once.

The command ``make warm``, ``make test``, ``make demo`` and the Docker image run before
the services start; the work is embedded mode's
(:mod:`pyrsia.services.embedded.kernel_warmup`), the one room that imports both engines.
"""

from __future__ import annotations

from pyrsia.services.embedded.kernel_warmup import main, warm_up

__all__ = ["main", "warm_up"]

if __name__ == "__main__":
    main()
