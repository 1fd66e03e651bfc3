"""The summary of one data set's end-to-end runs (``e2e_bench.py``): the best run of each
side, the same-run pairs (each Pyrsia run against the baseline run of the same repeat and
thread count) with each side's medians over them, and the references the flags asked for
(TorchRec, bf16 autocast, fused Adam).
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from e2e.peers import peer_medians, peer_pairs
from e2e_runs import BATCH


def summarize(
    name: str,
    data: dict[str, Any],
    args: argparse.Namespace,
    runs: dict[str, list[dict[str, Any]]],
    pyrsia_sides: list[str],
) -> dict[str, Any]:
    """One data set's result: the best run of each side, the same-run pairs and each side's
    median over them (``medians``: ratio, AUC gap, samples/s of both sides), and the
    references the flags asked for."""
    best = {k: max(v, key=lambda r: r["samples_per_s"]) for k, v in runs.items()}
    b = best["baseline"]
    p = best[pyrsia_sides[0]]
    pairs = same_run_pairs(runs, pyrsia_sides)
    medians = pair_medians(pairs, pyrsia_sides)
    for side in pyrsia_sides:  # split rank batches: more, smaller batches, the same rows
        if best[side]["samples"] != b["samples"]:
            raise RuntimeError(
                f"{name}: {side} trained {best[side]['samples']} rows, the baseline {b['samples']}"
            )
    return {
        "dataset": name,
        "train_rows": len(data["train_label"]),
        "test_rows": len(data["test_label"]),
        "slots": len(data["slot_names"]),
        "dense": int(data["train_dense"].shape[1]),
        "batch_size": BATCH,
        "steps": p["steps"],
        "runs": runs,
        "pyrsia": p,
        "baseline": b,
        "ratio": p["samples_per_s"] / b["samples_per_s"],
        "pairs": pairs,
        "medians": medians,
        "pyrsia_sides": {side: best[side] for side in pyrsia_sides},
        "ratios": {side: best[side]["samples_per_s"] / b["samples_per_s"] for side in pyrsia_sides},
        "mixed_precision": args.mixed_precision,
        "load_average": os.getloadavg(),
        **references(args, runs, best, pyrsia_sides),
    }


def references(
    args: argparse.Namespace,
    runs: dict[str, list[dict[str, Any]]],
    best: dict[str, dict[str, Any]],
    pyrsia_sides: list[str],
) -> dict[str, Any]:
    """The result's fields of the peers and references the flags asked for: TorchRec, its
    pairs with the baseline and every Pyrsia side's pairs with it (``peer_pairs``,
    ``peer_medians``), the bf16 baseline and its ratio, the fused-Adam baseline, its ratio
    and pairs (against the first of ``pyrsia_sides``, the RESULT line's Pyrsia side)."""
    first_side = pyrsia_sides[0]
    p = best[first_side]
    versus = peer_pairs(runs, pyrsia_sides, "torchrec") if args.torchrec else []
    return {
        **(
            {
                "torchrec": best["torchrec"],
                "torchrec_pairs": [
                    {
                        "threads": tr["threads"],
                        "ratio": tr["samples_per_s"] / br["samples_per_s"],
                        "auc_gap": tr["auc"] - br["auc"],
                    }
                    for tr, br in zip(runs["torchrec"], runs["baseline"], strict=True)
                ],
                "peer_pairs": versus,
                "peer_medians": {"torchrec": peer_medians(versus)},
            }
            if args.torchrec
            else {}
        ),
        **(
            {
                "baseline_bf16": best["baseline_bf16"],
                "ratio_vs_bf16_baseline": p["samples_per_s"]
                / best["baseline_bf16"]["samples_per_s"],
            }
            if args.mixed_precision
            else {}
        ),
        **(
            {
                "baseline_fused_adam": best["baseline_fused_adam"],
                "ratio_vs_fused_adam_baseline": p["samples_per_s"]
                / best["baseline_fused_adam"]["samples_per_s"],
                "fused_adam_pairs": [
                    {
                        "threads": br["threads"],
                        "ratio": pr["samples_per_s"] / br["samples_per_s"],
                        "auc_gap": pr["auc"] - br["auc"],
                    }
                    for pr, br in zip(runs[first_side], runs["baseline_fused_adam"], strict=True)
                ],
            }
            if args.fused_adam
            else {}
        ),
    }


def same_run_pairs(runs: dict[str, list[dict[str, Any]]], pyrsia_sides: list[str]) -> list[dict]:
    """Each Pyrsia run against the baseline run of the same repeat and threads."""
    return [
        {
            "side": side,
            "nn_workers": pr["nn_workers"],
            "threads": pr["threads"],
            "ratio": pr["samples_per_s"] / br["samples_per_s"],
            "auc_gap": pr["auc"] - br["auc"],
            "pyrsia_samples_per_s": pr["samples_per_s"],
            "baseline_samples_per_s": br["samples_per_s"],
            "pyrsia_auc": pr["auc"],
            "baseline_auc": br["auc"],
        }
        for side in pyrsia_sides
        for pr, br in zip(runs[side], runs["baseline"], strict=True)
    ]


def pair_medians(pairs: list[dict], pyrsia_sides: list[str]) -> dict[str, dict[str, float]]:
    """Each side's median over its same-run pairs: ratio, AUC gap, both sides' figures."""
    return {
        side: {
            k: statistics.median(q[k] for q in pairs if q["side"] == side)
            for k in (
                "ratio",
                "auc_gap",
                "pyrsia_samples_per_s",
                "baseline_samples_per_s",
                "pyrsia_auc",
                "baseline_auc",
            )
        }
        for side in pyrsia_sides
    }
