#!/usr/bin/env bash
# `make compose-test`: the Adult job under docker compose, across containers
# (tests/compose/test_compose_job.py). Starts a Docker engine when none runs and this user
# can (scripts/docker/dockerd.sh), builds the images (scripts/docker/images.sh), runs the
# test. Where no engine can be had it says why and exits 0: a skip, not a failure.
#   usage: compose_test.sh [PYTHON]     (default .venv/bin/python)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
python="${1:-$repo/.venv/bin/python}"
if [ "$#" -gt 1 ] || [ "${python#-}" != "$python" ]; then
  echo "usage: compose_test.sh [PYTHON]  (default .venv/bin/python)" >&2
  exit 2
fi
[ -x "$python" ] || { echo "compose_test.sh: $python is not an executable Python (make venv)" >&2; exit 2; }
start=$SECONDS
status=0
"$repo/scripts/docker/dockerd.sh" || status=$?
if [ "$status" = 3 ]; then
  echo "compose-test: SKIPPED, no Docker engine can be started here (reason above)"
  exit 0
fi
[ "$status" = 0 ] || exit "$status"
"$repo/scripts/docker/images.sh"
echo "compose-test: images ready in $((SECONDS - start)) s"
cd "$repo"
"$python" -m pytest -q -s -m compose -p no:cacheprovider tests/compose
echo "compose-test: done in $((SECONDS - start)) s"
