#!/usr/bin/env bash
# Print the Debian mirror this machine's apt uses (the first `URIs:` of a deb822 source, or
# the first `deb URL` line, that serves the main archive, not debian-security).
# Read at run time, so that no mirror is written into the repository.
#   usage: debian_mirror.sh [SOURCES_DIR]     (default /etc/apt)
set -euo pipefail
dir="${1:-/etc/apt}"
if [ "$#" -gt 1 ] || [ "${dir#-}" != "$dir" ]; then
  echo "usage: debian_mirror.sh [APT_DIR]  (default /etc/apt)" >&2
  exit 2
fi
files=()
for f in "$dir"/sources.list "$dir"/sources.list.d/*.sources "$dir"/sources.list.d/*.list; do
  [ -f "$f" ] && files+=("$f")
done
mirror=""
if [ "${#files[@]}" -gt 0 ]; then
  mirror="$(awk '
    /^[[:space:]]*#/ { next }
    /^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }
    /^deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } break } }
  ' "${files[@]}")"
fi
if [ -z "$mirror" ]; then
  echo "debian_mirror.sh: no Debian mirror found in $dir/sources.list or $dir/sources.list.d;" \
       "pass one to base_image.sh with --mirror URL" >&2
  exit 1
fi
echo "${mirror%/}"
