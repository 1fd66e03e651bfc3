"""A checkpoint or packet manifest's checksum of itself.

The data files are CRC-checked against their manifest (``checkpoint_verify.py``); the manifest
is checked the same way. ``seal`` adds ``manifest_crc32``: the CRC-32 of the manifest's
canonical JSON (every other key, sorted, no whitespace, ASCII), so any edit of a parsed value
(its ``entries`` count, its hyperparameters, a file name) is refused by ``verify``, while the
file's formatting is free. A manifest written before manifests carried the key loads with
every other check, its ``entries`` total checked against its dims; ``verify`` then returns
``False`` so the caller can say so once.
"""

from __future__ import annotations

import json
import zlib

from pyrsia.shared.errors import InvalidInputError

KEY = "manifest_crc32"


def manifest_crc32(manifest: dict) -> int:
    """The CRC-32 of ``manifest``'s canonical JSON, without its own ``manifest_crc32``."""
    body = {k: v for k, v in manifest.items() if k != KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return zlib.crc32(text.encode("ascii"))


def seal(manifest: dict) -> dict:
    """``manifest`` with its ``manifest_crc32`` (written last, over the final content)."""
    return {**manifest, KEY: manifest_crc32(manifest)}


def verify(manifest: dict, where: str, field: str) -> bool:
    """Check ``manifest`` (read from ``where``): its checksum when it has one, and its
    ``entries`` total against its dims (already checked) in any case. ``True`` when the
    checksum was there and matched, ``False`` for a manifest written without one; raises
    ``InvalidInputError`` naming ``field`` for a mismatch."""
    recorded = manifest.get(KEY)
    if recorded is not None:
        if isinstance(recorded, bool) or not isinstance(recorded, int):
            raise InvalidInputError(field, f"{where}: an integer {KEY}", recorded)
        got = manifest_crc32(manifest)
        if got != recorded:
            raise InvalidInputError(
                field,
                f"{where}: {KEY} {recorded:08x} as recorded by the dump",
                f"{got:08x} (the manifest was edited or damaged after it was written)",
            )
    dims = manifest.get("dims") or {}
    total = sum(int(info.get("entries", 0)) for info in dims.values())
    if "entries" in manifest and manifest["entries"] != total:
        raise InvalidInputError(
            field,
            f"{where}: entries equal to the sum of its dims' entries ({total})",
            manifest["entries"],
        )
    return recorded is not None
