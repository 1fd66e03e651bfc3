"""A kernel cached by numba is compiled again when a module it inlines changes
(pyrsia/shared/kernel_cache.py): without it, the edit would not be seen."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DEP = """
import numba as nb

@nb.njit(inline="always", cache=True)
def value():
    return {value}
"""

KERNEL = """
{guard}
import numba as nb
from pkg.dep import value

@nb.njit(cache=True)
def kernel():
    return value()
"""

GUARD = (
    "from pyrsia.shared.kernel_cache import drop_if_inlined_changed\n"
    "drop_if_inlined_changed(__file__, ('dep.py',))"
)


def _run(root: Path, module: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", f"from pkg.{module} import kernel; print(kernel())"],
        # No .pyc: Python's own cache would keep an edit made within the second it was
        # written (same size, same whole-second mtime) from being seen, numba or not.
        env={
            "PYTHONPATH": f"{root}:{REPO}",
            "PATH": "/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return int(out.stdout.split()[-1])


def test_an_edit_to_an_inlined_module_reaches_the_cached_kernel(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "dep.py").write_text(textwrap.dedent(DEP.format(value=1)))
    (pkg / "guarded.py").write_text(KERNEL.format(guard=GUARD))
    (pkg / "plain.py").write_text(KERNEL.format(guard=""))
    assert _run(tmp_path, "guarded") == 1 and _run(tmp_path, "plain") == 1  # both cached now
    assert list((pkg / "__pycache__").glob("guarded.*.nbi"))
    written = (pkg / "dep.py").stat()
    (pkg / "dep.py").write_text(textwrap.dedent(DEP.format(value=2)))
    os.utime(pkg / "dep.py", ns=(written.st_atime_ns, written.st_mtime_ns))  # same second
    assert _run(tmp_path, "guarded") == 2
    assert _run(tmp_path, "plain") == 1  # numba alone keeps the stale machine code
    assert _run(tmp_path, "guarded") == 2  # from the cache compiled after the edit
