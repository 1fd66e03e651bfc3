"""The feed-rate benchmark's report (``feed_rate.py``): its tables, the comparison of two
trees' services and its chart.

Kept apart from ``feed_rate.py`` (the command line and the runs) so each file has one job.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from _common import fmt_rate, print_table


def label(c: dict[str, Any]) -> str:
    """A configuration's short name: ``census/sleep/1024`` (``.../ps2`` with 2 PS shards,
    ``.../ew2`` with 2 embedding workers)."""
    return "/".join([c["dataset"], c["dense"], str(c["batch"]), *replicas(c)])


def replicas(c: dict[str, Any]) -> list[str]:
    """``ps2``, ``ew2``: the PS shards and embedding workers of a configuration, where more
    than one."""
    counts = (("ps", c.get("ps_replicas", 1)), ("ew", c.get("ew_replicas", 1)))
    return [f"{role}{n}" for role, n in counts if n > 1]


def compare_trees(results: list[dict[str, Any]], ref: str) -> list[dict[str, Any]]:
    """Per configuration, the median CPU ms per batch of the working tree's services and of
    ``ref``'s (same-run, interleaved runs) and their ratio (``ref`` / working tree: > 1 is a
    saving), with the median samples/s of each."""
    out = []
    for r in results:
        keys = list(dict.fromkeys(label(c) for c in r["configs"]))
        for key in keys:
            runs = {
                t: [c for c in r["configs"] if label(c) == key and c["services"] == t]
                for t in ("working tree", ref)
            }
            row: dict[str, Any] = {"config": key, "runs": len(runs[ref])}
            for what, get in (
                ("embedding_worker", lambda c: c["services_cpu_ms_per_batch"]["embedding_worker"]),
                ("embedding_ps", lambda c: c["services_cpu_ms_per_batch"]["embedding_ps"]),
                ("nn_worker", lambda c: c["nn_cpu_ms_outside_dense"]),
                ("samples_per_s", lambda c: c["samples_per_s"]),
            ):
                new = statistics.median(get(c) for c in runs["working tree"])
                old = statistics.median(get(c) for c in runs[ref])
                row[what] = {"working_tree": new, ref: old, "ratio": old / new if new else None}
            out.append(row)
    return out


def print_report(results: list[dict[str, Any]], compare: list[dict[str, Any]]) -> None:
    """Every run's table, the services' comparison with ``--services-ref`` (when run), then
    each working-tree run's phase split, thread CPU and cores."""
    _print_runs(results)
    if compare:
        _print_comparison(compare)
    _print_details(results)


def _print_runs(results: list[dict[str, Any]]) -> None:
    """One row per run: samples/s, the baseline, CPU ms per batch, NN workers fed per core."""
    rows = []
    for r in results:
        for c in r["configs"]:
            svc = c["services_cpu_ms_per_batch"]
            feeds = c["nn_workers_fed_per_core"]
            rows.append(
                {
                    "config": label(c),
                    "services": c["services"],
                    "samples/s": fmt_rate(c["samples_per_s"]),
                    "baseline": fmt_rate(c["baseline_samples_per_s"]),
                    "ratio": f"{c['ratio']:.2f}",
                    "nn_out": f"{c['nn_cpu_ms_outside_dense']:.2f}",
                    "ps": f"{svc.get('embedding_ps', 0):.2f}",
                    "ew": f"{svc.get('embedding_worker', 0):.2f}",
                    "dl": f"{svc.get('data_loader', 0):.2f}",
                    "fed_ew": f"{feeds['embedding_worker']:.2f}",
                    "fed_ps": f"{feeds['embedding_ps']:.2f}",
                }
            )
    print(
        "\nSamples/s of one NN-worker process, CPU ms per batch (NN worker outside the dense "
        "step; PS, embedding worker, data loader), NN workers one EW / PS core feeds:"
    )
    print_table(
        rows,
        [
            ("config", "config"),
            ("services", "services"),
            ("samples/s", "samples/s"),
            ("baseline", "baseline"),
            ("ratio", "ratio"),
            ("nn_out", "nn_cpu_ms"),
            ("ps", "ps_cpu_ms"),
            ("ew", "ew_cpu_ms"),
            ("dl", "dl_cpu_ms"),
            ("fed_ew", "nn/ew_core"),
            ("fed_ps", "nn/ps_core"),
        ],
    )


def _print_comparison(compare: list[dict[str, Any]]) -> None:
    """The working tree's services against ``--services-ref``'s, medians side by side."""
    ref = next(k for k in compare[0]["embedding_worker"] if k not in ("working_tree", "ratio"))
    print(
        f"\nServices of the working tree against {ref} (medians of same-run runs; "
        "ratio = old / new, > 1 a saving):"
    )
    print_table(
        [
            {
                "config": c["config"],
                "runs": c["runs"],
                **{
                    f"{k}_{p}": f"{c[k][p]:.2f}" if k != "samples_per_s" else fmt_rate(c[k][p])
                    for k in ("embedding_worker", "embedding_ps", "nn_worker", "samples_per_s")
                    for p in ("working_tree", ref)
                },
                **{
                    f"{k}_ratio": f"{c[k]['ratio']:.3f}"
                    for k in ("embedding_worker", "embedding_ps", "nn_worker", "samples_per_s")
                },
            }
            for c in compare
        ],
        [("config", "config"), ("runs", "runs")]
        + [
            (f"{k}_{p}", f"{short}_{'new' if p == 'working_tree' else 'old'}")
            for k, short in (
                ("embedding_worker", "ew_ms"),
                ("embedding_ps", "ps_ms"),
                ("nn_worker", "nn_ms"),
                ("samples_per_s", "samples/s"),
            )
            for p in ("working_tree", ref)
        ]
        + [
            (f"{k}_ratio", f"{short}_ratio")
            for k, short in (
                ("embedding_worker", "ew"),
                ("embedding_ps", "ps"),
                ("nn_worker", "nn"),
                ("samples_per_s", "samples/s"),
            )
        ],
    )


def _print_details(results: list[dict[str, Any]]) -> None:
    """Each working-tree run's training-thread phases, CPU by thread and cores used."""
    for r in results:
        for c in r["configs"]:
            phases = ", ".join(
                f"{k} {v['wall']:.2f} ({v['cpu']:.2f})" for k, v in c["nn_phases_ms"].items()
            )
            threads = ", ".join(
                f"{k} {v:.2f}"
                for k, v in sorted(c["nn_threads_cpu_ms"].items(), key=lambda kv: -kv[1])
            )
            cores = ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(c["cores_used"].items(), key=lambda kv: -kv[1])
            )
            if c["services"] != "working tree":
                continue
            print(f"\n[{label(c)}] training thread ms per batch wall (CPU): {phases}")
            print(f"[{label(c)}] NN worker CPU ms per batch by thread: {threads}")
            print(f"[{label(c)}] cores used in the window: {cores}")


def plot(results: list[dict[str, Any]], path: Path) -> Path | None:
    """Grouped bars of samples/s per data set and batch size: one bar per dense step and
    replica count (the median of the working tree's runs) and the 2-thread baseline's
    (``benchmarks/plots.py``; None without matplotlib)."""
    from plots import save_bar_chart

    def series_name(c: dict[str, Any]) -> str:
        return " ".join([f"dense {c['dense']}", *replicas(c)])

    own = [c for r in results for c in r["configs"] if c["services"] == "working tree"]
    names = list(dict.fromkeys(series_name(c) for c in own))
    labels, series = [], {}
    for r in results:
        for b in r["baselines"]:
            labels.append(f"{r['dataset']} {b['batch']}")
            for name in names:
                rates = [
                    c["samples_per_s"]
                    for c in r["configs"]
                    if c["services"] == "working tree"
                    and c["batch"] == b["batch"]
                    and series_name(c) == name
                ]
                series.setdefault(name, []).append(statistics.median(rates) if rates else None)
            series.setdefault("baseline (2 threads)", []).append(b["samples_per_s"])
    return save_bar_chart(
        path,
        labels,
        series,
        ylabel="samples/s",
        title="Feed rate: samples/s of one NN-worker process",
    )
