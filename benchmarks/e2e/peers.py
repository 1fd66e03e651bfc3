"""The single-process peers of the end-to-end benchmark (``--peers``): which run, and how each
Pyrsia side compares with them.

A peer is another single-process trainer of the same model and batches, run in every round
beside the baseline (today one: ``torchrec``, TorchRec's fused CPU embeddings,
``benchmarks/torchrec_peer.py``). A peer whose library is not installed is skipped with one
line saying why and how to install it, so ``--peers torchrec`` runs everywhere; the older
``--torchrec`` flag insists (exits 2 when TorchRec is missing).

Each Pyrsia run is paired with the peer's run of the same round (same threads, same minute):
``peer_pairs`` holds ``pyrsia ÷ peer`` per pair and ``peer_medians`` their median per side::

    round k:  pyrsia_embedded[k]   baseline[k]   torchrec[k]
              ratio = pyrsia_embedded[k].samples_per_s / torchrec[k].samples_per_s
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

PEERS = ("torchrec",)
"""The peers ``--peers`` accepts."""


def resolve_peers(
    requested: Sequence[str], missing: dict[str, Callable[[], str | None]]
) -> tuple[list[str], list[str]]:
    """The peers of ``requested`` that can run here, and one line per peer skipped.

    ``missing[peer]()`` says why the peer cannot run (None when it can)."""
    run, skipped = [], []
    for peer in requested:
        why = missing[peer]()
        if why is None:
            run.append(peer)
        else:
            skipped.append(f"[peers] {peer} peer skipped: {why}")
    return run, skipped


def peer_pairs(
    runs: dict[str, list[dict[str, Any]]], pyrsia_sides: Sequence[str], peer: str
) -> list[dict[str, Any]]:
    """Every Pyrsia run against ``peer``'s run of the same round: ``ratio`` is Pyrsia's
    samples/s over the peer's, ``auc_gap`` Pyrsia's test AUC minus the peer's."""
    return [
        {
            "side": side,
            "peer": peer,
            "threads": pr["threads"],
            "ratio": pr["samples_per_s"] / tr["samples_per_s"],
            "auc_gap": pr["auc"] - tr["auc"],
            "pyrsia_samples_per_s": pr["samples_per_s"],
            "peer_samples_per_s": tr["samples_per_s"],
        }
        for side in pyrsia_sides
        for pr, tr in zip(runs[side], runs[peer], strict=True)
    ]


def peer_medians(pairs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per Pyrsia side, the median ``ratio`` and ``auc_gap`` of its pairs with the peer."""
    sides = dict.fromkeys(q["side"] for q in pairs)
    return {
        side: {
            k: statistics.median(q[k] for q in pairs if q["side"] == side)
            for k in ("ratio", "auc_gap")
        }
        for side in sides
    }


def format_peer_pairs(pairs: Sequence[dict[str, Any]], side: str) -> str:
    """One side's pairs with the peer as the report prints them: ``2t 1.04 (AUC -0.0003)``."""
    return ", ".join(
        f"{q['threads']}t {q['ratio']:.2f} (AUC {q['auc_gap']:+.4f})"
        for q in pairs
        if q["side"] == side
    )
