#!/usr/bin/env bash
# The CUDA path checked in one command on a GPU machine (issue 30): which GPU, driver and torch,
# then `make test-gpu` (scripts/test_gpu.sh: the wheels of `make gpu-wheels` installed offline,
# the tests marked `cuda`, among them a short feed-rate benchmark run with the dense step on
# CUDA; per-test durations; a JUnit report).
#
# Everything lands in $OUT (default /tmp/pyrsia-gpu-check): gpu_check.log, junit.xml (the
# figures as test properties), the Adult jobs' logs, the feed-rate benchmark's JSON and PNG.
# Exit status: make test-gpu's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pyrsia-gpu-check}
mkdir -p "$OUT"
export PYRSIA_GPU_ARTIFACTS="$OUT" PYTHONUNBUFFERED=1
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} --junitxml=$OUT/junit.xml -o junit_family=xunit1"
{
    date -u
    nvidia-smi || echo "nvidia-smi: not found"
    python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| CUDA', torch.version.cuda, '| cuDNN', torch.backends.cudnn.version(), '|', \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
    python3 -m pip list 2>/dev/null | grep -iE '^(pytest|pytest-timeout|numba|numpy|aiohttp|msgpack|uvloop|prometheus.client|tensorboard) '
    nproc
    start=$(date +%s)
    if command -v make >/dev/null; then make test-gpu; else bash scripts/test_gpu.sh; fi
    echo $? >"$OUT/.rc"
    echo "test-gpu: exit $(cat "$OUT/.rc") after $(($(date +%s) - start)) s"
} 2>&1 | tee "$OUT/gpu_check.log"
rc=$(cat "$OUT/.rc" 2>/dev/null || echo 1)
rm -f "$OUT/.rc"
exit "$rc"
