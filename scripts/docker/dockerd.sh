#!/usr/bin/env bash
# Make sure a Docker engine answers: use the running one, else start dockerd (root only) with
# --iptables=false --bridge=none, which runs where the host's firewall cannot be changed.
# Compose's own networks (a bridge per project, with its DNS) work under these flags; there
# is no default bridge, so `docker build` runs with --network host (scripts/docker/images.sh).
# The engine is left running, with its images, for the next run.
#   usage: dockerd.sh [--log FILE] [--timeout SECONDS]
# Exit status: 0 an engine answers; 3 none can be had here (the reason on stderr); 2 bad usage.
set -euo pipefail
log="${PYRSIA_IMAGE_CACHE:-/var/cache/pyrsia}/dockerd.log"
timeout=60
usage() { echo "usage: dockerd.sh [--log FILE] [--timeout SECONDS]" >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --log|--timeout) [ "$#" -ge 2 ] && [ -n "$2" ] || { echo "dockerd.sh: $1 needs a value" >&2; usage; }
      case "$1" in --log) log="$2";; --timeout) timeout="$2";; esac
      shift 2;;
    -h|--help) usage;;
    *) echo "dockerd.sh: unknown argument $1" >&2; usage;;
  esac
done
case "$timeout" in ''|*[!0-9]*) echo "dockerd.sh: --timeout must be a whole number of seconds, got $timeout" >&2; usage;; esac

cannot() { echo "dockerd.sh: no Docker engine: $*" >&2; exit 3; }
command -v docker >/dev/null || cannot "the docker command is not installed (apt-get install docker.io)"
if docker info >/dev/null 2>&1; then
  echo "docker: an engine is running ($(docker info --format '{{.ServerVersion}}, storage {{.Driver}}'))"
  exit 0
fi
[ "$(id -u)" = 0 ] || cannot "none is running and starting dockerd needs root"
command -v dockerd >/dev/null || cannot "none is running and dockerd is not installed (apt-get install docker.io)"
mkdir -p "$(dirname "$log")"
echo "docker: starting dockerd --iptables=false --bridge=none (log: $log)"
nohup dockerd --iptables=false --bridge=none >>"$log" 2>&1 &
pid=$!
for _ in $(seq "$timeout"); do
  if docker info >/dev/null 2>&1; then
    echo "docker: dockerd $pid answers ($(docker info --format '{{.ServerVersion}}, storage {{.Driver}}'))"
    exit 0
  fi
  kill -0 "$pid" 2>/dev/null || { tail -5 "$log" >&2; cannot "dockerd exited at start (log: $log)"; }
  sleep 1
done
tail -5 "$log" >&2
cannot "dockerd did not answer within ${timeout}s (log: $log)"
