#!/usr/bin/env bash
# Format every Python file of the tree with ruff's formatter (the project's one style).
#
#   scripts/dev/format_all.sh [ROOT]     (ROOT: a checkout; default: this one)
#
# First every trailing `# fmt: skip` marker is removed, so that no statement keeps a
# hand-made layout; then `ruff format` formats the tree. A data table that reads better
# aligned keeps its layout between `# fmt: off` and `# fmt: on` lines, which this script
# leaves alone (tests/test_format_markers.py allows fewer than 20 markers in all).
# PERSIA's verbatim files (tests/persia_upstream, examples/adult_income) are not touched.
# Running it twice changes nothing the second time.
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
root="$(cd "${1:-$here}" && pwd)"
ruff="${RUFF:-$here/.venv/bin/ruff}"
[ -x "$ruff" ] || ruff="$(command -v ruff)" || { echo "format_all.sh: no ruff (make venv)" >&2; exit 2; }

cd "$root"
# tracked files and new ones git does not ignore, as tests/test_code_size.py scans them
git ls-files -z --cached --others --exclude-standard -- '*.py' \
    ':!:tests/persia_upstream/' ':!:examples/adult_income/' |
    while IFS= read -r -d '' file; do
        [ -f "$file" ] && printf '%s\0' "$file"
    done |
    xargs -0 -r sed -i -E 's/[[:space:]]*# fmt: skip[[:space:]]*$//'
"$ruff" format --quiet .
