"""The end-to-end benchmark's report: the runs table, per-process CPU, step split, its chart.

Kept apart from ``e2e_bench.py`` (which runs the two sides) so each file has one job.
``_common`` is importable because ``e2e_bench.py`` runs from ``benchmarks/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import fmt_rate, print_table
from e2e.peers import format_peer_pairs
from plots import save_bar_chart
from sched_stats import per_batch


def print_report(results: list[dict[str, Any]]) -> None:
    """Every run, the best of each Pyrsia side against the baseline's best (``ratio``) beside
    the median of its same-run pairs, the TorchRec peer (when run), then each data set's load
    average and each Pyrsia side's details."""
    _print_runs(results)
    print()
    print_table(
        [
            {
                "data": r["dataset"],
                "side": side,
                "pyrsia": fmt_rate(p["samples_per_s"]),
                "baseline": fmt_rate(r["baseline"]["samples_per_s"]),
                "ratio": f"{r['ratios'][side]:.3f}",
                "pairs": str(sum(q["side"] == side for q in r["pairs"])),
                "median_ratio": f"{r['medians'][side]['ratio']:.3f}",
                "median_gap": f"{r['medians'][side]['auc_gap']:+.4f}",
                "auc_pyrsia": f"{p['auc']:.4f}",
                "auc_baseline": f"{r['baseline']['auc']:.4f}",
                "auc_gap": f"{p['auc'] - r['baseline']['auc']:+.4f}",
                "startup_s": f"{p['startup_s']:.1f}",
                "eval_s": f"{p['eval_seconds']:.1f}",
            }
            for r in results
            for side, p in r["pyrsia_sides"].items()
        ],
        [
            (k, k)
            for k in (
                "data",
                "side",
                "pyrsia",
                "baseline",
                "ratio",
                "auc_pyrsia",
                "auc_baseline",
                "auc_gap",
                "pairs",
                "median_ratio",
                "median_gap",
                "startup_s",
                "eval_s",
            )
        ],
    )
    _print_peers(results)
    for r in results:
        load = r.get("load_average")
        if load:
            print(
                f"\n[{r['dataset']}] load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
            )
        for side, p in r["pyrsia_sides"].items():
            _print_side(r, side, p)


def _print_runs(results: list[dict[str, Any]]) -> None:
    """One row per run of every side, the best of each side starred."""
    rows = []
    for r in results:
        for side in r["runs"]:
            for run in r["runs"][side]:
                best = r.get("pyrsia_sides", {}).get(side) or r.get(side)
                rows.append(
                    {
                        "data": r["dataset"],
                        "side": side,
                        "ranks": run.get("nn_workers", ""),
                        "threads": run["threads"],
                        "steps": run["steps"],
                        "train_s": f"{run['train_seconds']:.2f}",
                        "samples/s": fmt_rate(run["samples_per_s"]),
                        "auc": f"{run['auc']:.4f}",
                        "cpu_ms/batch": f"{1e3 * run['cpu_s'] / max(run['timed_steps'], 1):.0f}",
                        "best": "*" if run is best else "",
                    }
                )
    print()
    print_table(
        rows,
        [
            (k, k)
            for k in (
                "data",
                "side",
                "ranks",
                "threads",
                "steps",
                "train_s",
                "samples/s",
                "auc",
                "cpu_ms/batch",
                "best",
            )
        ],
    )


def _print_peers(results: list[dict[str, Any]]) -> None:
    """The TorchRec peer against the baseline, for the data sets where it ran."""
    peers = [
        {
            "data": r["dataset"],
            "torchrec": fmt_rate(r["torchrec"]["samples_per_s"]),
            "baseline": fmt_rate(r["baseline"]["samples_per_s"]),
            "ratio": f"{r['torchrec']['samples_per_s'] / r['baseline']['samples_per_s']:.3f}",
            "auc_torchrec": f"{r['torchrec']['auc']:.4f}",
            "auc_baseline": f"{r['baseline']['auc']:.4f}",
            "auc_gap": f"{r['torchrec']['auc'] - r['baseline']['auc']:+.4f}",
            "pairs": ", ".join(f"{q['threads']}t {q['ratio']:.2f}" for q in r["torchrec_pairs"]),
        }
        for r in results
        if "torchrec" in r
    ]
    if peers:
        print("\nTorchRec peer (fused CPU embeddings, single process) against the baseline:")
        print_table(
            peers,
            [
                (k, k)
                for k in (
                    "data",
                    "torchrec",
                    "baseline",
                    "ratio",
                    "auc_torchrec",
                    "auc_baseline",
                    "auc_gap",
                    "pairs",
                )
            ],
        )


def _print_side(r: dict[str, Any], side: str, p: dict[str, Any]) -> None:
    """Where one Pyrsia configuration's time went: start-up, step split, threads, CPU per process."""
    tag = f"{r['dataset']}/{side}"
    steps = max(p.get("rank_timed_steps", p["timed_steps"]), 1)
    _print_step(tag, p, r["baseline"], steps)
    _print_ranks(tag, p)
    pairs = ", ".join(
        f"{q['threads']}t {q['ratio']:.2f} (AUC {q['auc_gap']:+.4f})"
        for q in r["pairs"]
        if q.get("side", "pyrsia") == side
    )
    print(f"[{tag}] same-run pairs, ratio (AUC gap): {pairs}")
    for peer, by_side in r.get("peer_medians", {}).items():
        m = by_side[side]
        print(
            f"[{tag}] against the {peer} peer, same-run pairs, ratio (AUC gap): "
            f"{format_peer_pairs(r['peer_pairs'], side)}; median {m['ratio']:.3f} "
            f"(AUC {m['auc_gap']:+.4f})"
        )
    _print_references(tag, r, side)
    cpu = ", ".join(
        f"{k} {v['cores']:.2f}" for k, v in sorted(p["cpu"].items(), key=lambda kv: -kv[1]["cores"])
    )
    print(f"[{tag}] CPU cores used during training (2 available): {cpu}")
    _print_sched(tag, p, steps)
    for svc, hists in p["metrics"].items():
        text = ", ".join(
            f"{k} mean {v['mean_ms']:.1f} p50<={v['p50_ms']:.1f} p90<={v['p90_ms']:.1f} ms x{v['count']:.0f}"
            for k, v in hists.items()
            if v["count"]
        )
        print(f"[{tag}] {svc} /metrics means: {text}")


def _print_sched(tag: str, p: dict[str, Any], steps: int) -> None:
    """Each process's CPU, run-queue wait and context switches per training step
    (``sched_stats``), the figures a change to the services' per-batch work moves."""
    rows = [
        f"{name} {s['cpu_ms']:.2f} cpu / {s['runq_ms']:.2f} runq ms, "
        f"{s['vcsw']:.1f} vol / {s['ivcsw']:.1f} invol cs"
        for name, v in sorted(p["cpu"].items(), key=lambda kv: -kv[1]["cpu_s"])
        if "sched" in v
        for s in [per_batch(v["sched"], steps)]
    ]
    if rows:
        print(f"[{tag}] per step, by process: " + "; ".join(rows))


def _print_step(tag: str, p: dict[str, Any], b: dict[str, Any], steps: int) -> None:
    """Pyrsia's start-up, its training thread's step split next to the baseline ``b``'s step,
    its wait percentiles, CPU per thread and page faults (rank 0's ``steps`` timed steps)."""
    split = ", ".join(
        f"{k} {1e3 * v['wall_s'] / steps:.1f} ({1e3 * v['cpu_s'] / steps:.1f})"
        for k, v in p["phases"].items()
    )
    busy = {k: v for k, v in p["phases"].items() if k not in ("wait", "flush")}
    step_wall = 1e3 * sum(v["wall_s"] for v in busy.values()) / steps
    step_cpu = 1e3 * sum(v["cpu_s"] for v in busy.values()) / steps
    base_wall = 1e3 * b["train_seconds"] / max(b["timed_steps"], 1)
    base_cpu = 1e3 * b["cpu_s"] / max(b["timed_steps"], 1)
    threads = ", ".join(
        f"{k} {1e3 * v / steps:.1f}"
        for k, v in sorted(p["threads_cpu_s"].items(), key=lambda kv: -kv[1])
        if v > 0
    )
    print(
        f"\n[{tag}] Pyrsia start-up: servers registered {p['services_registered_s']:.1f}s, "
        f"TrainCtx entered {p['ctx_ready_s']:.1f}s, first batch {p['startup_s']:.1f}s"
    )
    print(f"[{tag}] NN worker training thread, ms per step wall (CPU): {split}")
    print_step_split(tag, p, b)
    print(
        f"[{tag}] NN worker step without wait: {step_wall:.1f} ms wall, "
        f"{step_cpu:.1f} ms CPU; baseline step: {base_wall:.1f} ms wall, {base_cpu:.1f} ms CPU "
        f"({b['threads']} thread(s))"
    )
    w = p.get("wait_ms")
    if w:
        print(
            f"[{tag}] NN worker wait for the next batch, ms per step: "
            f"p50 {w['p50']:.2f}, p90 {w['p90']:.2f}, max {w['max']:.1f}"
        )
    print(f"[{tag}] NN worker CPU ms per step by thread: {threads}")
    if "page_faults" in p:  # fresh pages the heap took back from the kernel (allocator.py)
        print(
            f"[{tag}] page faults per step: NN worker {p['page_faults'] / steps:.0f} "
            f"(malloc tuning {p.get('malloc_tuning', 'on')}), "
            f"baseline {b.get('page_faults', 0) / max(b['timed_steps'], 1):.0f}"
        )


def _print_ranks(tag: str, p: dict[str, Any]) -> None:
    """Each NN-worker rank's own batches, seconds, cores and step split (several ranks only)."""
    for rank, own in enumerate(p.get("ranks", [])):
        n = max(own["steps"] - 1, 1)
        split = ", ".join(
            f"{k} {1e3 * v['wall_s'] / n:.1f} ({1e3 * v['cpu_s'] / n:.1f})"
            for k, v in own["phases"].items()
        )
        busy_cpu = sum(own["threads_cpu_s"].values()) / max(own["train_seconds"], 1e-9)
        print(
            f"[{tag}] rank {rank}: {own['steps']} batches, {own['train_seconds']:.2f}s, "
            f"{busy_cpu:.2f} cores; ms per step wall (CPU): {split}"
        )


def _print_references(tag: str, r: dict[str, Any], side: str) -> None:
    """The reference baselines, when run: under bf16 autocast, and with fused Adam (the
    latter's pairs on the first Pyrsia side only)."""
    if "baseline_bf16" in r:
        bb = r["baseline_bf16"]
        print(
            f"[{tag}] Pyrsia bf16 vs baseline under bf16 autocast (reference): "
            f"{fmt_rate(bb['samples_per_s'])} samples/s, AUC {bb['auc']:.4f}, "
            f"ratio {r['ratio_vs_bf16_baseline']:.3f}"
        )
    if "baseline_fused_adam" in r and side == next(iter(r["pyrsia_sides"])):  # its pairs
        bf = r["baseline_fused_adam"]
        fused_pairs = ", ".join(
            f"{q['threads']}t {q['ratio']:.2f} (AUC {q['auc_gap']:+.4f})"
            for q in r["fused_adam_pairs"]
        )
        print(
            f"[{tag}] Pyrsia with fused Adam vs the baseline with fused Adam (reference): "
            f"{fmt_rate(bf['samples_per_s'])} samples/s, AUC {bf['auc']:.4f}, "
            f"best-of ratio {r['ratio_vs_fused_adam_baseline']:.3f}; pairs {fused_pairs}"
        )


# Rows of the side-by-side split: (label, NN-worker phase, baseline phase).
_SPLIT_ROWS = (
    ("wait for batch", "wait", None),
    ("tensors from batch", "features", None),
    ("embedding lookup", None, "embedding"),
    ("forward (model, loss)", "forward", "forward"),
    ("backward (autograd)", "autograd", "autograd"),
    ("gradient send / sparse step", "gradient_send", "embedding_step"),
    ("dense optimizer step", "dense_step", "dense_step"),
    ("other on the thread", "other", None),
)


def print_step_split(name: str, pyrsia: dict[str, Any], baseline: dict[str, Any]) -> None:
    """The NN worker's training thread next to the baseline's step, ms per step.

    For each side: wall, CPU, run queue (ready without a core) and blocked (wall − CPU − run
    queue: the GIL, a lock, torch's worker threads); the last two only where the kernel
    reports run-queue delay.
    """
    base_phases = baseline.get("phases") or {}
    ps = max(pyrsia.get("rank_timed_steps", pyrsia["timed_steps"]), 1)  # rank 0's steps
    bs = max(baseline["timed_steps"], 1)

    def cells(prefix: str, kept: list[dict[str, float]], steps: int) -> dict[str, str]:
        if not kept:
            return {f"{prefix}_{c}": "-" for c in ("wall", "cpu", "runq", "blocked")}
        wall = 1e3 * sum(v["wall_s"] for v in kept) / steps
        cpu = 1e3 * sum(v["cpu_s"] for v in kept) / steps
        out = {f"{prefix}_wall": f"{wall:.2f}", f"{prefix}_cpu": f"{cpu:.2f}"}
        if all("runq_s" in v for v in kept):
            runq = 1e3 * sum(v["runq_s"] for v in kept) / steps
            out[f"{prefix}_runq"] = f"{runq:.2f}"
            out[f"{prefix}_blocked"] = f"{max(wall - cpu - runq, 0.0):.2f}"
        else:
            out[f"{prefix}_runq"] = out[f"{prefix}_blocked"] = "-"
        return out

    def pick(phases: dict, key: str | None) -> list[dict[str, float]]:
        return [phases[key]] if key is not None and key in phases else []

    rows = [
        {
            "phase": label,
            **cells("nn", pick(pyrsia["phases"], pk), ps),
            **cells("base", pick(base_phases, bk), bs),
        }
        for label, pk, bk in _SPLIT_ROWS
    ]
    rows.append(
        {
            "phase": "step without wait",
            **cells(
                "nn", [v for k, v in pyrsia["phases"].items() if k not in ("wait", "flush")], ps
            ),
            **cells("base", list(base_phases.values()), bs),
        }
    )
    print(f"\n[{name}] training thread, ms per step, same run:")
    columns = [("phase", "phase")]
    for prefix, side in (("nn", "NN worker"), ("base", "baseline")):
        columns += [
            (f"{prefix}_wall", f"{side} wall"),
            (f"{prefix}_cpu", "CPU"),
            (f"{prefix}_runq", "run queue"),
            (f"{prefix}_blocked", "blocked"),
        ]
    print_table(rows, columns)


def save_chart(results: list[dict[str, Any]], json_path: Path) -> Path | None:
    """The PNG beside the JSON: samples/s of every Pyrsia side and the baseline, per data set
    (the best run of each), with the AUC of each in its legend; the path written."""
    sides = list(dict.fromkeys(side for r in results for side in r["pyrsia_sides"]))
    series: dict[str, list[float | None]] = {}
    for side in [*sides, "baseline"]:
        runs = [
            r["baseline"] if side == "baseline" else r["pyrsia_sides"].get(side) for r in results
        ]
        aucs = ", ".join(f"{run['auc']:.4f}" for run in runs if run)
        series[f"{side} (AUC {aucs})"] = [run["samples_per_s"] if run else None for run in runs]
    return save_bar_chart(
        json_path,
        [r["dataset"] for r in results],
        series,
        title="End to end: Pyrsia against one PyTorch process",
        ylabel="samples/s",
    )
