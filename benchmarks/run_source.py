"""Run a module from another source tree: ``python -m benchmarks.run_source DIR -m MODULE ARGS...``.

Benchmarks use it to start a baseline commit's services (``git archive`` of that commit
unpacked into DIR) next to the working tree's, in the same run on the same machine, so
a speed-up is a same-run ratio rather than two runs on a machine whose load changes.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: python -m benchmarks.run_source DIR -m MODULE [ARGS...]")
    source, module = Path(sys.argv[1]).resolve(), sys.argv[3]
    if not ((source / "pyrsia" / "shared").is_dir() or (source / "shared").is_dir()):
        raise SystemExit(f"{source} is not a Pyrsia source tree (no shared/ in it)")
    here = Path(__file__).resolve().parents[1]
    keep = [p for p in sys.path if p and Path(p).resolve() != here]
    sys.path[:] = [str(source), *keep]
    os.chdir(source)
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
