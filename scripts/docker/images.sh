#!/usr/bin/env bash
# Build every image of docker-compose.yml on a machine with no registry access (`make images`):
#   pyrsia-base:bookworm        Debian bookworm from debootstrap (base_image.sh), cached as a tarball
#   pyrsia:latest               the Dockerfile on that base, every wheel from the wheelhouse
#                               (wheelhouse.sh, cached), with no package index in the container
#   pyrsia-redis:bookworm       Debian's redis-server (docker/redis.Dockerfile)
#   pyrsia-prometheus:bookworm  Debian's prometheus (docker/prometheus.Dockerfile)
# The Redis and Prometheus images install Debian packages during the build (host network).
# The cache (default /var/cache/pyrsia, or $PYRSIA_IMAGE_CACHE) lives outside the clone, so a
# rerun from a fresh clone only rebuilds what changed.
#   usage: images.sh [--cache DIR] [--image NAME] [--only app|redis|prometheus]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${PYRSIA_IMAGE_CACHE:-/var/cache/pyrsia}"
image="pyrsia:latest"
only=""
base="pyrsia-base:bookworm"
usage() { echo "usage: images.sh [--cache DIR] [--image NAME] [--only app|redis|prometheus]" >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --cache|--image|--only) [ "$#" -ge 2 ] && [ -n "$2" ] || { echo "images.sh: $1 needs a value" >&2; usage; }
      case "$1" in --cache) cache="$2";; --image) image="$2";; --only) only="$2";; esac
      shift 2;;
    -h|--help) usage;;
    *) echo "images.sh: unknown argument $1" >&2; usage;;
  esac
done
case "$only" in ""|app|redis|prometheus) ;; *) echo "images.sh: --only must be app, redis or prometheus, got $only" >&2; usage;; esac
docker info >/dev/null 2>&1 || { echo "images.sh: no Docker engine answers (docker info failed)" >&2; exit 1; }
export PYRSIA_IMAGE_CACHE="$cache"

timed() {  # timed LABEL COMMAND...: run, then print how long it took
  local label="$1" start=$SECONDS
  shift
  "$@"
  echo "images: $label in $((SECONDS - start)) s"
}
build() {  # build NAME DOCKERFILE [CONTEXT [--cache-stage]]: no context (stdin) for the Debian-package images
  local name="$1" file="$2" log="$cache/build-${1//[:\/]/_}.log"
  shift 2
  if [ "$#" -gt 1 ]; then
    { docker build --network host --build-arg BASE_IMAGE="$base" --target build -t pyrsia-build:cache \
        -f "$file" "$1" && docker build --network host --build-arg BASE_IMAGE="$base" -t "$name" -f "$file" "$1"; } >"$log" 2>&1
  elif [ "$#" -gt 0 ]; then
    docker build --network host --build-arg BASE_IMAGE="$base" -t "$name" -f "$file" "$1" >"$log" 2>&1
  else
    docker build --network host --build-arg BASE_IMAGE="$base" -t "$name" - <"$file" >"$log" 2>&1
  fi || { tail -30 "$log" >&2; echo "images.sh: building $name failed (log: $log)" >&2; exit 1; }
}

mkdir -p "$cache"
timed "base image" "$here/base_image.sh" --name "$base" --cache "$cache"
if [ -z "$only" ] || [ "$only" = app ]; then
  timed "wheelhouse" "$here/wheelhouse.sh" --cache "$cache" --out "$repo/docker/wheelhouse"
  # the build stage tagged too (pyrsia-build:cache), so that the prune below keeps the layer
  # of installed dependencies that a change to the code does not invalidate
  timed "$image" build "$image" "$repo/Dockerfile" "$repo" --cache-stage
fi
if [ -z "$only" ] || [ "$only" = redis ]; then
  timed "pyrsia-redis:bookworm" build pyrsia-redis:bookworm "$repo/docker/redis.Dockerfile"
fi
if [ -z "$only" ] || [ "$only" = prometheus ]; then
  timed "pyrsia-prometheus:bookworm" build pyrsia-prometheus:bookworm "$repo/docker/prometheus.Dockerfile"
fi
# earlier builds of these names leave untagged images behind; they only take disk
docker image prune -f >/dev/null
