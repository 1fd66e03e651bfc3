"""Ending a process right after it has shut down cleanly.

Kept free of heavy imports on purpose: it runs at the end of a SIGTERM, when importing
aiohttp alone (1.3 s on a loaded 2-core machine) would eat the supervisor's grace period.
"""

from __future__ import annotations

import logging
import os
import sys


def exit_now(code: int) -> None:
    """Flush logs and standard streams, then end the process without finalization.

    Interpreter finalization (garbage-collecting the numba, aiohttp, torch and numpy object
    graphs) took 1-4 s on a loaded machine; every resource has been released by its owner
    before this is called, so skipping it loses nothing.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
