#!/usr/bin/env bash
# The wheelhouse the offline image installs from (`pip install --no-index --find-links`):
# torch (CPU), every dependency of the project and its build backend (setuptools, wheel),
# fetched on this host with its own pip (the container needs no access to a package index)
# and kept in the cache. The image builds the project itself from its source. Air-gapped
# clusters use the same folder.
#   usage: wheelhouse.sh [--cache DIR] [--out DIR] [--python PYTHON]
# --out: where the wheels are gathered for the build (default docker/wheelhouse in the repo,
# the folder the Dockerfile copies).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${PYRSIA_IMAGE_CACHE:-/var/cache/pyrsia}"
out="$repo/docker/wheelhouse"
python="${PYTHON:-python3}"
# redis-py needs async-timeout on Python < 3.11.3 (Debian bookworm's is 3.11.2); this host's pip
# evaluates that marker for its own Python, so it is fetched by name
EXTRA_WHEELS="async-timeout>=4.0.3"
torch_version="$(sed -n 's/^TORCH_VERSION := //p' "$repo/Makefile")"
usage() { echo "usage: wheelhouse.sh [--cache DIR] [--out DIR] [--python PYTHON]" >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --cache|--out|--python) [ "$#" -ge 2 ] && [ -n "$2" ] || { echo "wheelhouse.sh: $1 needs a value" >&2; usage; }
      case "$1" in --cache) cache="$2";; --out) out="$2";; --python) python="$2";; esac
      shift 2;;
    -h|--help) usage;;
    *) echo "wheelhouse.sh: unknown argument $1" >&2; usage;;
  esac
done
[ -n "$torch_version" ] || { echo "wheelhouse.sh: TORCH_VERSION not found in the Makefile" >&2; exit 1; }

wheels="$cache/wheelhouse"
stamp="$wheels/.complete-$(sha256sum "$repo/pyproject.toml" | cut -c1-16)-torch$torch_version"
mkdir -p "$wheels" "$out"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
pip_quiet() {  # pip's output only when it fails
  "$python" -m pip "$@" >"$build/pip.log" 2>&1 || { cat "$build/pip.log" >&2; exit 1; }
}
# the project's wheel (pure Python), only to read its dependencies from
pip_quiet wheel -q --no-deps -w "$build" "$repo"
project_wheel="$(ls "$build"/pyrsia-*.whl)"
if [ ! -e "$stamp" ]; then
  echo "wheelhouse: fetching torch==$torch_version and the project's dependencies into $wheels"
  # PYRSIA_TORCH_INDEX: an extra index for torch, e.g. PyTorch's CPU-only one where the
  # host's pip would otherwise fetch the CUDA build (this machine's pip finds the CPU wheel)
  pip_quiet download -q --only-binary=:all: -d "$wheels" \
    ${PYRSIA_TORCH_INDEX:+--extra-index-url "$PYRSIA_TORCH_INDEX"} \
    "torch==$torch_version" "setuptools>=68" wheel "$project_wheel" "$EXTRA_WHEELS"
  rm -f "$wheels"/pyrsia-*.whl "$wheels"/.complete-*
  touch "$stamp"
else
  echo "wheelhouse: $wheels is complete for this pyproject.toml"
fi
# gather for the build context: hard links where the file system allows, else copies
rm -f "$out"/*.whl
cp -l "$wheels"/*.whl "$out"/ 2>/dev/null || cp "$wheels"/*.whl "$out"/
echo "wheelhouse: $(ls "$out"/*.whl | wc -l) wheels in $out"
