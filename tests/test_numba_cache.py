"""Every compiled kernel is loaded from numba's on-disk cache by the next process.

A kernel the cache cannot find again (e.g. one that calls an intrinsic defined in a
closure) is compiled anew by every process that warms it: ~1 s of CPU each time, taken
from the first training steps (the warm-up runs beside them).
"""

import json
import subprocess
import sys

REPORT = """
import gc, json
from numba.core.registry import CPUDispatcher
from pyrsia.services.warmup import warm_up
warm_up()
kernels = [o for o in gc.get_objects() if isinstance(o, CPUDispatcher)]
print(json.dumps({
    k.py_func.__module__ + "." + k.py_func.__qualname__: {"hits": sum(k.stats.cache_hits.values()),
                             "misses": sum(k.stats.cache_misses.values())}
    for k in kernels if k.signatures and k.py_func.__module__.startswith("pyrsia")
}))
"""


def _warm_in_a_new_process() -> dict[str, dict[str, int]]:
    out = subprocess.run(
        [sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_kernel_comes_from_the_cache_in_the_next_process():
    _warm_in_a_new_process()  # compiles what is not cached yet
    kernels = _warm_in_a_new_process()
    names = {name.rsplit(".", 1)[-1] for name in kernels}
    assert {"add_blocks", "add_rows", "lookup_train", "dedup_prefixed", "gather_block"} <= names, (
        sorted(kernels)
    )
    recompiled = {name: k for name, k in kernels.items() if k["misses"]}
    assert not recompiled, f"compiled again instead of loaded from the cache: {recompiled}"
