"""Several ranks keep the quality: test AUC of 2 NN-worker ranks against one process, cause by cause.

Same model, data and hyperparameters as ``benchmarks/e2e_bench.py`` (the DLRM of
``benchmarks/e2e``; Census-Income and the Criteo-shaped set; embedding ``Adagrad(0.05,
initial_accumulator_value=0.01)``, dense ``Adam(1e-3)``), 1 torch thread per process. Each
configuration runs once per seed; the table gives the test AUC's mean and spread (half the
range) over the seeds and its gap to the single-process baseline of the same seed.

Configurations (``--configs``, comma-separated; default all):

=====================  ====================================================================
``baseline``           one PyTorch process, batch B (1,024): the reference
``baseline_2b``        one process at the doubled batch 2B, dense lr x 2: the rows every
                       synchronous dense step of 2 whole-batch ranks averages
``baseline_2b_lr1``    the same at the baseline's dense lr
``sync_2ranks``        2 ranks of B emulated in one process, in lockstep, nothing in flight:
                       the dense gradient averaged over the two batches (DDP), each batch's
                       embedding gradient applied by itself (PERSIA's ``sum``), dense lr x 2.
                       What 2 ranks compute with no staleness at all
``sync_2ranks_mean``   the same with each embedding gradient divided by 2 (``mean``)
``pyrsia``             Pyrsia, 1 rank of B, ``embedding_staleness`` 8 (the benchmark's)
``pyrsia_2b``          Pyrsia, 1 rank of 2B, dense lr x 2: the doubled batch without a 2nd rank
``pyrsia_2ranks``      Pyrsia, 2 ranks of B (``--rank-batch whole``), dense lr x 2,
                       staleness 8 per rank: e2e_bench's 2-rank row
``pyrsia_2ranks_mean`` the same with ``TrainCtx(embedding_grad_reduction="mean")``
``pyrsia_2ranks_lr1``  the same at the baseline's dense lr
``pyrsia_2ranks_s4``   the same at staleness 4 per rank (8 for the job)
``pyrsia_2ranks_s2``   the same at staleness 2 per rank
``pyrsia_2ranks_s1``   the same at staleness 1 per rank (2 for the job)
``pyrsia_2ranks_split`` Pyrsia, 2 ranks of B / 2 (``--rank-batch split``): the global batch
                       and dense lr of the baseline, staleness 8 per rank
=====================  ====================================================================

A seed sets the dense model's and the baseline's embedding initialization and, on the
Criteo-shaped set, the data; Pyrsia's PS draws its own initialization per run. samples/s
is training samples over the timed loop (the first step excluded), as in e2e_bench.

    python benchmarks/rank_quality.py [--datasets criteo,census] [--criteo-rows 200000]
                                      [--seeds 0,1,2] [--configs baseline,pyrsia_2ranks,...]
                                      [--json F]

Prints a table and JSON, and ends with
``RESULT <dataset>_<config>_gap=...`` for every configuration (mean gap over the seeds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import REPO, print_table, write_json
from torch import nn

sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

from baseline import FlatEmbeddings, array_batches, roc_auc, train_single_process  # noqa: E402
from e2e import data as e2e_data  # noqa: E402
from e2e.model import (  # noqa: E402
    DENSE_LR,
    EMBEDDING_DIM,
    EMBEDDING_LR,
    INIT_RANGE,
    INITIAL_ACCUMULATOR,
    SEED,
    build_model,
)
from e2e_runs import run_pyrsia  # noqa: E402

BATCH = 1024
STALENESS = 8
TEST_BATCH = 4096

CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": dict(kind="baseline", rows=BATCH, lr_scale=1),
    "baseline_2b": dict(kind="baseline", rows=2 * BATCH, lr_scale=2),
    "baseline_2b_lr1": dict(kind="baseline", rows=2 * BATCH, lr_scale=1),
    "sync_2ranks": dict(kind="sync", ranks=2, rows=BATCH, lr_scale=2, reduction="sum"),
    "sync_2ranks_mean": dict(kind="sync", ranks=2, rows=BATCH, lr_scale=2, reduction="mean"),
    "pyrsia": dict(kind="pyrsia", ranks=1, rows=BATCH, lr_scale=1),
    "pyrsia_2b": dict(kind="pyrsia", ranks=1, rows=2 * BATCH, lr_scale=2),
    "pyrsia_2ranks": dict(kind="pyrsia", ranks=2, rows=BATCH, lr_scale=2),
    "pyrsia_2ranks_mean": dict(kind="pyrsia", ranks=2, rows=BATCH, lr_scale=2, reduction="mean"),
    "pyrsia_2ranks_lr1": dict(kind="pyrsia", ranks=2, rows=BATCH, lr_scale=1),
    "pyrsia_2ranks_s4": dict(kind="pyrsia", ranks=2, rows=BATCH, lr_scale=2, staleness=4),
    "pyrsia_2ranks_s2": dict(kind="pyrsia", ranks=2, rows=BATCH, lr_scale=2, staleness=2),
    "pyrsia_2ranks_s1": dict(kind="pyrsia", ranks=2, rows=BATCH, lr_scale=2, staleness=1),
    "pyrsia_2ranks_split": dict(kind="pyrsia", ranks=2, rows=BATCH // 2, lr_scale=1),
}


def model_factory(data: dict[str, Any], seed: int) -> Callable[[], nn.Module]:
    """The benchmark's DLRM with its weights drawn from ``SEED + seed``."""
    return lambda: build_model(len(data["slot_names"]), data["train_dense"].shape[1], SEED + seed)


def run_baseline(data: dict[str, Any], seed: int, rows: int, lr_scale: float) -> dict[str, Any]:
    """One PyTorch process (``benchmarks.baseline``) at ``rows`` per batch, dense lr x ``lr_scale``."""
    res = train_single_process(
        array_batches(data["train_cat_ids"], data["train_dense"], data["train_label"], rows),
        array_batches(data["test_cat_ids"], data["test_dense"], data["test_label"], TEST_BATCH),
        slot_sizes=[int(c) for c in data["cardinalities"]],
        dim=EMBEDDING_DIM,
        model_factory=model_factory(data, seed),
        embedding_lr=EMBEDDING_LR,
        dense_lr=DENSE_LR * lr_scale,
        initial_accumulator_value=INITIAL_ACCUMULATOR,
        emb_initialization=INIT_RANGE,
        seed=seed,
    )
    return {"auc": res["auc"], "samples_per_s": res["samples_per_s"], "steps": res["steps"]}


def run_sync(
    data: dict[str, Any], seed: int, ranks: int, rows: int, lr_scale: float, reduction: str
) -> dict[str, Any]:
    """``ranks`` data-parallel ranks of ``rows`` emulated in one process with nothing in flight.

    Every group of ``ranks`` consecutive batches is one synchronous step: each rank's batch
    is looked up at the same parameters, the dense gradient is the mean of the ranks' mean
    losses' gradients (as DDP averages them), then each rank's embedding gradient (its own
    mean loss's, divided by ``ranks`` with ``reduction="mean"``) is applied by its own
    Adagrad step, one rank after the other, as the PS applies each rank's ``/gradients``.
    With ``ranks=1`` this is the baseline's training.
    """
    torch.manual_seed(seed)
    embeddings = FlatEmbeddings([int(c) for c in data["cardinalities"]], EMBEDDING_DIM, INIT_RANGE)
    model = model_factory(data, seed)()
    table = embeddings.table.weight
    emb_opt = torch.optim.Adagrad(
        [table], lr=EMBEDDING_LR, initial_accumulator_value=INITIAL_ACCUMULATOR
    )
    dense_opt = torch.optim.Adam(model.parameters(), lr=DENSE_LR * lr_scale)
    loss_fn = nn.BCEWithLogitsLoss()
    batches = list(
        array_batches(data["train_cat_ids"], data["train_dense"], data["train_label"], rows)
    )
    start = time.perf_counter()
    with torch.sparse.check_sparse_tensor_invariants(enable=False):
        for g in range(0, len(batches), ranks):
            group = batches[g : g + ranks]
            dense_opt.zero_grad(set_to_none=True)
            grads = []
            for cat_ids, dense, label in group:
                idx = embeddings.rows(cat_ids)
                emb = embeddings(idx).detach().requires_grad_()
                loss = loss_fn(model([torch.from_numpy(dense)], [emb]), torch.from_numpy(label))
                (loss / len(group)).backward()  # DDP: the mean over the ranks
                own = emb.grad * len(group)  # this rank's own mean-loss gradient
                grads.append((idx, own / ranks if reduction == "mean" else own))
            dense_opt.step()
            for idx, grad in grads:  # one embedding update per rank, as the PS applies them
                table.grad = torch.sparse_coo_tensor(
                    idx.reshape(1, -1), grad.reshape(-1, EMBEDDING_DIM), table.shape
                ).coalesce()
                emb_opt.step()
    seconds = time.perf_counter() - start
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for cat_ids, dense, label in array_batches(
            data["test_cat_ids"], data["test_dense"], data["test_label"], TEST_BATCH
        ):
            logits = model([torch.from_numpy(dense)], [embeddings(embeddings.rows(cat_ids))])
            scores.append(logits.numpy().reshape(-1))
            labels.append(label.reshape(-1))
    auc = roc_auc(np.concatenate(labels), np.concatenate(scores))
    return {"auc": auc, "samples_per_s": len(data["train_label"]) / seconds, "steps": len(batches)}


def run_config(
    name: str, data: dict[str, Any], data_path: Path, tmp: Path, seed: int
) -> dict[str, Any]:
    """One run of configuration ``name`` (see the module's docstring)."""
    c = CONFIGS[name]
    if c["kind"] == "baseline":
        return run_baseline(data, seed, c["rows"], c["lr_scale"])
    if c["kind"] == "sync":
        return run_sync(data, seed, c["ranks"], c["rows"], c["lr_scale"], c["reduction"])
    configs = e2e_data.write_configs(data, tmp)
    res = run_pyrsia(
        data_path,
        configs,
        tmp,
        threads=1,
        staleness=c.get("staleness", STALENESS),
        max_steps=0,
        nn_workers=c["ranks"],
        batch=c["rows"],
        tuned=True,  # batch-id order
        extra_env={
            "E2E_DENSE_LR_SCALE": str(c["lr_scale"]),
            "E2E_SEED": str(SEED + seed),
            "E2E_EMB_GRAD_REDUCTION": c.get("reduction", "sum"),
        },
    )
    return {"auc": res["auc"], "samples_per_s": res["samples_per_s"], "steps": res["steps"]}


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per configuration: AUC and its gap to the same seed's baseline, mean and spread."""
    base = {r["seed"]: r["auc"] for r in runs.get("baseline", [])}
    rows = []
    for name, rs in runs.items():
        aucs = [r["auc"] for r in rs]
        gaps = [r["auc"] - base[r["seed"]] for r in rs if r["seed"] in base]
        sps = [r["samples_per_s"] for r in rs]
        rows.append(
            {
                "config": name,
                "seeds": len(rs),
                "auc_mean": statistics.fmean(aucs),
                "auc_spread": (max(aucs) - min(aucs)) / 2,
                "gap_mean": statistics.fmean(gaps) if gaps else float("nan"),
                "gap_min": min(gaps) if gaps else float("nan"),
                "gap_max": max(gaps) if gaps else float("nan"),
                "samples_per_s": statistics.fmean(sps),
            }
        )
    return rows


def print_rows(dataset: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{dataset}: test AUC over seeds (gap: to the same seed's 1-process baseline at B)")
    print_table(
        [
            {
                **r,
                "auc": f"{r['auc_mean']:.4f} ± {r['auc_spread']:.4f}",
                "gap": f"{r['gap_mean']:+.4f} [{r['gap_min']:+.4f}, {r['gap_max']:+.4f}]",
                "sps": f"{r['samples_per_s'] / 1e3:.1f}k",
            }
            for r in rows
        ],
        [
            ("config", "configuration"),
            ("seeds", "seeds"),
            ("auc", "AUC mean ± half range"),
            ("gap", "gap mean [min, max]"),
            ("sps", "samples/s"),
        ],
    )


def int_list(parser: argparse.ArgumentParser, flag: str, value: str) -> list[int]:
    """``value`` as distinct non-negative integers separated by commas (else exit 2)."""
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 0 or len(set(items)) != len(items):
        parser.error(f"{flag}: expected distinct integers >= 0 separated by commas, got {value!r}")
    return items


def run_dataset(
    dataset: str,
    configs: list[str],
    seeds: list[int],
    tmp: Path,
    criteo_rows: int,
    caps: dict[str, int],
) -> dict[str, list[dict[str, Any]]]:
    """Every configuration on ``dataset`` drawn with each seed: its runs per configuration."""
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for seed in seeds:
        path = e2e_data.prepare(
            dataset, tmp / f"{dataset}-{seed}.npz", criteo_rows=criteo_rows, seed=seed, **caps
        )
        data = e2e_data.load(path)
        for name in configs:
            res = run_config(name, data, path, tmp, seed)
            res["seed"] = seed
            runs[name].append(res)
            print(
                f"{dataset} seed {seed} {name}: AUC {res['auc']:.4f}, "
                f"{res['samples_per_s'] / 1e3:.1f}k samples/s",
                flush=True,
            )
    return runs


def parse_args(
    argv: list[str] | None,
) -> tuple[argparse.Namespace, list[str], list[str], list[int]]:
    """The command line, checked: the args, the data sets, the configurations (the baseline
    first: every gap is to it) and the seeds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--datasets",
        default="criteo,census",
        help="data sets, in this order (default criteo,census)",
    )
    parser.add_argument(
        "--criteo-rows",
        type=int,
        default=200_000,
        help="training rows of the Criteo-shaped set (default 200,000)",
    )
    parser.add_argument("--seeds", default="0,1,2", help="seeds (default 0,1,2)")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"configurations, comma-separated (default all: {', '.join(CONFIGS)})",
    )
    parser.add_argument(
        "--max-train-rows",
        type=int,
        default=0,
        help="train on the first N rows only (0: all; for smoke runs)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the JSON here (default bench_results/)"
    )
    args = parser.parse_args(argv)
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not datasets or not set(datasets) <= set(e2e_data.DATASETS):
        parser.error(f"--datasets: expected a comma-separated subset of {e2e_data.DATASETS}")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or not set(configs) <= set(CONFIGS) or len(set(configs)) != len(configs):
        parser.error(f"--configs: expected distinct names among {', '.join(CONFIGS)}")
    if "baseline" not in configs:
        configs.insert(0, "baseline")  # every gap is to it
    seeds = int_list(parser, "--seeds", args.seeds)
    if args.criteo_rows < 1 or args.max_train_rows < 0:
        parser.error("--criteo-rows: expected >= 1; --max-train-rows: expected >= 0")
    return args, datasets, configs, seeds


def main(argv: list[str] | None = None) -> int:
    args, datasets, configs, seeds = parse_args(argv)
    caps = {"max_train_rows": args.max_train_rows} if args.max_train_rows else {}
    torch.set_num_threads(1)  # the in-process sides, as Pyrsia's ranks: 1 torch thread each
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pyrsia-rank-quality-") as tmp_name:
        tmp = Path(tmp_name)
        for dataset in datasets:
            runs = run_dataset(dataset, configs, seeds, tmp, args.criteo_rows, caps)
            rows = summarize(runs)
            results[dataset] = {"runs": runs, "rows": rows}
            print_rows(dataset, rows)
    path = write_json(
        "rank_quality",
        {"seeds": seeds, "criteo_rows": args.criteo_rows, "results": results},
        args.json,
    )
    print(f"\nJSON: {path}")
    print(
        "RESULT "
        + " ".join(
            f"{d}_{r['config']}_gap={r['gap_mean']:.4f}"
            for d, v in results.items()
            for r in v["rows"]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
