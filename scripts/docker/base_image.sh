#!/usr/bin/env bash
# The offline base image: Debian bookworm (minbase, plus python3, python3-venv and
# ca-certificates) made by debootstrap from this machine's Debian mirror and loaded with
# `docker import`, for machines that cannot pull python:3.11-slim from a registry.
# The root file system is kept as a tarball in the cache, so a rerun (or a fresh Docker
# engine) only imports it again.
#   usage: base_image.sh [--name IMAGE] [--cache DIR] [--mirror URL] [--suite SUITE]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="pyrsia-base:bookworm"
cache="${PYRSIA_IMAGE_CACHE:-/var/cache/pyrsia}"
mirror=""
suite="bookworm"
usage() { echo "usage: base_image.sh [--name IMAGE] [--cache DIR] [--mirror URL] [--suite SUITE]" >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --name|--cache|--mirror|--suite) [ "$#" -ge 2 ] && [ -n "$2" ] || { echo "base_image.sh: $1 needs a value" >&2; usage; }
      case "$1" in --name) name="$2";; --cache) cache="$2";; --mirror) mirror="$2";; --suite) suite="$2";; esac
      shift 2;;
    -h|--help) usage;;
    *) echo "base_image.sh: unknown argument $1" >&2; usage;;
  esac
done

if docker image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name: present"
  exit 0
fi
tarball="$cache/base-$suite.tar"
if [ ! -s "$tarball" ]; then
  command -v debootstrap >/dev/null || {
    echo "base_image.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
  [ -n "$mirror" ] || mirror="$("$here/debian_mirror.sh")"
  mkdir -p "$cache"
  root="$(mktemp -d "$cache/rootfs.XXXXXX")"
  trap 'rm -rf "$root"' EXIT
  echo "base image $name: debootstrap $suite from the apt mirror (about a minute)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
fi
echo "base image $name: docker import $tarball"
docker import "$tarball" "$name" >/dev/null
