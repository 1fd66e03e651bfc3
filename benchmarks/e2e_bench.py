"""End-to-end benchmark: Pyrsia's whole pipeline vs a single PyTorch process, same model, same batches.

The DLRM-style model of ``benchmarks/e2e/model.py`` (dim-16 embedding per slot, dense
features -> 64, top MLP 592-512-256-1 on Census-Income) is trained two ways:

(a) Pyrsia: redis-server, one embedding PS, one embedding worker, the NN worker
    (``persia-launcher nn-worker benchmarks/e2e/train.py --nproc-per-node 1``) and one data
    loader (``persia-launcher data-loader benchmarks/e2e/data_loader.py``), all real
    processes on loopback; every one must exit 0.
(b) the baseline of issue 10, ``benchmarks.baseline.train_single_process``: one
    ``nn.Embedding(sum of vocabularies, 16, sparse=True)`` with per-slot offsets (one lookup
    for all slots), Uniform(+-0.01), ``torch.optim.Adagrad(lr=0.05,
    initial_accumulator_value=0.01)``; dense ``Adam(1e-3)``; ``BCEWithLogitsLoss``.

By default Pyrsia runs the README's code as written: train.py's loop is
``for batch in DataLoader(StreamingDataset(buffer_size=10)): ctx.backward(loss_fn(*ctx.forward(batch)))``
with no DataLoader option and no thread setting (``--threads default``: torch's own on both
sides; the launcher gives a one-rank NN worker every core). ``--settings defaults,tuned``
adds the tuned rows (sides ``*_tuned``): ``embedding_staleness=--staleness``,
``reproducible=True`` (batches in batch-id order, the baseline's) and a 16-batch buffer.

Same batches (batch size 1,024; the data loader sends them in the baseline's order, and the
NN worker takes them as they arrive, in batch-id order with ``reproducible``), same number
of steps, same hyperparameters (``e2e/model.py``). samples/s is training samples over the
wall time of the training loop only, the first step excluded on both sides (Pyrsia:
measured inside train.py from the end of the first step to the last gradients applied;
start-up and evaluation are reported separately). Each side runs at each ``--threads``
count, ``--repeats`` times, interleaved: each Pyrsia run is paired with the baseline run
of the same round, and the RESULT line reports the medians over the first side's pairs
(the ratio is the median of the pairs' ratios), with the CPU model printed above it. Data:
the real Census-Income (KDD) set (one epoch, test AUC on the test split; UCI, Lane &
Kohavi 2000, CC BY 4.0) and a Criteo-shaped synthetic set.

Also reported: each process's CPU share over the training window (``/proc``) and, per
training step, its CPU, run-queue wait and context switches (voluntary: wake-ups;
involuntary: preemptions; ``e2e/sched_stats.py``), the services' ``/metrics`` latency means, the NN worker's CPU per thread, and where the
training thread's step goes, wall and CPU ms per step (waiting for the next looked-up
batch, forward, autograd, gradient send, dense optimizer step, final flush), next to the
baseline's step. On a shared machine compare the CPU columns and same-run ratios. Each
finished round is written to the JSON at once (``"partial": true``); a run stopped part-way
(Ctrl-C, a failing side) reports the rounds that finished and says so (``e2e/rounds.py``).
Ends with::

    RESULT pyrsia_samples_per_s=... baseline_samples_per_s=... ratio=... pyrsia_auc=... baseline_auc=...

    python benchmarks/e2e_bench.py [--quick] [--threads default,1,2] [--nn-workers 1,2] [--repeats N]
                                   [--mixed-precision] [--fused-adam] [--datasets census,criteo]
                                   [--criteo-rows 200000] [--settings defaults,tuned]
                                   [--staleness 8] [--peers torchrec]
                                   [--modes services,embedded]
                                   [--malloc-tuning on,off]
                                   [--json F]

``--fused-adam`` steps Pyrsia's dense model with ``Adam(fused=True)`` (a faster dense step;
the same update): the issue's baseline, with the default ``Adam``, stays the yardstick, and
the baseline with fused Adam is run and reported beside it as a reference.

``--malloc-tuning on,off`` runs Pyrsia with and without the NN worker's heap tuning
(``PERSIA_MALLOC_TUNING``, ``pyrsia/shared/allocator.py``) in the same run, in each mode of
``--modes`` (embedded: side ``pyrsia_embedded_malloc_off``); both sides report their page
faults per step.

``--modes services,embedded`` runs Pyrsia in services mode (the processes above) and in
embedded mode (``persia-launcher run --embedded``: the same train.py and data_loader.py, the
engines and the loader inside the NN worker's process; side ``pyrsia_embedded``) in the same
run; ``--modes embedded`` runs only the latter.

``--peers torchrec`` adds TorchRec's fused CPU embeddings (``torchrec_peer.py``) as a third
side, run in every round and reported like the baseline, and reports each Pyrsia side against
it as same-run pairs (``peer_pairs``, ``peer_medians``; a ``PEER`` line after the RESULT
line); without TorchRec installed (by hand, as that module says) it is skipped with a line
saying why (``--torchrec``: the same, but exits 2 then).

``--nn-workers 1,2`` runs Pyrsia with 1 and with 2 NN-worker ranks (each with as many data
loaders) in the same run, against the same baseline runs; ``--threads`` is then torch
threads per rank. ``--rank-batch`` says what a rank's batch is: ``whole`` (the default, as
PERSIA's data-parallel jobs run): every rank trains whole 1,024-row batches, so each
synchronous dense step averages ``n`` batches and the dense learning rate is scaled by
``n`` (linear scaling rule); ``split``: the global batch stays at 1,024 rows, each rank
trains 1,024 / ``n`` of them (rank ``r`` the ``r``-th slice of each baseline batch), so the
dense step averages exactly the baseline's batch and keeps its learning rate; the
embeddings get one update per rank batch. ``whole,split`` runs both.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import REPO, cpu_model, result_path, write_json
from plots import saved

sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

import torch  # noqa: E402
from e2e import data as e2e_data  # noqa: E402
from e2e.report import print_report, save_chart  # noqa: E402
from e2e.rounds import finished_rounds, run_rounds  # noqa: E402
from e2e_baseline import run_baselines  # noqa: E402
from e2e_cli import parse_args  # noqa: E402
from e2e_embedded import run_pyrsia_embedded  # noqa: E402
from e2e_runs import BATCH, rank_rows, run_pyrsia  # noqa: E402
from e2e_summary import summarize  # noqa: E402

from pyrsia.services.nn_worker.launch import rank_threads  # noqa: E402
from pyrsia.services.nn_worker.precision import cpu_computes_bf16  # noqa: E402

EMBEDDED_SIDE = "pyrsia_embedded"
TORCH_DEFAULT_THREADS = torch.get_num_threads()
"""Torch's own thread count in a fresh process here: the baseline's at ``--threads default``."""


# ------------------------------------------------------------------------------- report
def bench_dataset(
    name: str,
    data_path: Path,
    tmp: Path,
    args: argparse.Namespace,
    max_steps: int,
    save_partial: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Every side of one data set, ``--repeats`` times at each ``--threads`` count
    (interleaved, so a load change hits both sides alike), and their summary. Each finished
    round goes to ``save_partial``; a run stopped part-way is summarized over the finished
    rounds (``e2e/rounds.py``)."""
    data = e2e_data.load(data_path)
    configs = e2e_data.write_configs(data, tmp)
    sides, embedded = side_keys(args)
    mode_sides = [*sides.values(), *embedded.values()]
    runs = empty_runs(name, args, mode_sides)

    def one_round() -> None:  # every side once at each thread count
        for threads in args.threads:
            run_round(
                name,
                data,
                data_path,
                configs,
                tmp,
                args,
                sides,
                embedded,
                runs,
                threads=threads,
                max_steps=max_steps,
            )

    ended = run_rounds(
        args.repeats,
        one_round,
        lambda k: save_partial({"dataset": name, "rounds_done": k, "runs": runs}),
    )
    if not ended.complete:
        print(
            f"[{name}] stopped after {ended.done} of {ended.planned} round(s) by "
            f"{ended.stopped_by}: the report covers the finished rounds",
            flush=True,
        )
        runs = finished_rounds(runs, ended.done, len(args.threads))
    return {**summarize(name, data, args, runs, mode_sides), "rounds": ended.note()}


def side_keys(args: argparse.Namespace) -> tuple[dict[tuple, str], dict[tuple, str]]:
    """The runs keys of the services-mode sides and of the embedded-mode sides the flags ask
    for, by their (ranks, priority, rank batch, malloc, settings) and (malloc, settings)."""
    sides = {
        (n, prio, rb, mt, st): pyrsia_side(n, prio, rb, mt, st)
        for st in args.settings
        for n in args.nn_workers
        for prio in args.cpu_priority
        for rb in (args.rank_batch if n > 1 else ["whole"])  # one rank: the two are the same
        for mt in args.malloc_tuning
    }
    embedded = {
        (mt, st): embedded_side(mt, st) for st in args.settings for mt in args.malloc_tuning
    }
    return (
        sides if "services" in args.modes else {},
        embedded if "embedded" in args.modes else {},
    )


def empty_runs(
    name: str, args: argparse.Namespace, mode_sides: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """An empty list of runs per side: the Pyrsia sides, the baseline and the references
    the flags ask for (with a note when bf16 autocast is emulated on this CPU)."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in mode_sides}
    runs["baseline"] = []
    if args.mixed_precision:
        runs["baseline_bf16"] = []
        if cpu_computes_bf16() is False:
            print(
                f"[{name}] note: this CPU has no bf16 instructions (AVX-512 BF16 or AMX): "
                "bf16 autocast is emulated and runs many times slower than fp32 on both sides"
            )
    if args.fused_adam:
        runs["baseline_fused_adam"] = []
    if args.torchrec:
        runs["torchrec"] = []
    return runs


def oversubscribed(torch_threads: int) -> str:
    """A warning for the progress line when the ranks' torch threads outnumber this
    process's cores: their samples/s then measure the oversubscription too."""
    cores = len(os.sched_getaffinity(0))
    if torch_threads <= cores:
        return ""
    return f" (oversubscribed: {torch_threads} torch threads on {cores} cores)"


def run_round(
    name: str,
    data: dict[str, Any],
    data_path: Path,
    configs: tuple[Path, Path],
    tmp: Path,
    args: argparse.Namespace,
    sides: dict[tuple, str],
    embedded: dict[tuple, str],
    runs: dict[str, list[dict[str, Any]]],
    *,
    threads: int,
    max_steps: int,
) -> None:
    """One run of every side at ``threads`` torch threads (0: torch's default on each side),
    each appended to its ``runs``."""
    pyrsia_threads = threads or None  # None: train.py leaves torch's (the launcher's) default
    label = f"{threads}" if threads else "default"
    for (mt, st), side in embedded.items():
        print(
            f"[{name}] Pyrsia embedded (one process), {label} torch thread(s), {st}"
            f"{'' if mt == 'on' else ', malloc untuned'} ...",
            flush=True,
        )
        runs[side].append(
            run_pyrsia_embedded(
                data_path,
                configs,
                tmp,
                threads=pyrsia_threads,
                tuned=st == "tuned",
                staleness=args.staleness if st == "tuned" else None,
                max_steps=max_steps,
                profile=args.profile,
                fused_adam=args.fused_adam,
                malloc_tuning=mt,
            )
        )
    run_services_sides(
        name, data_path, configs, tmp, args, sides, runs, threads=threads, max_steps=max_steps
    )
    run_baselines(
        name, data, args, runs, threads=threads or TORCH_DEFAULT_THREADS, max_steps=max_steps
    )


def run_services_sides(
    name: str,
    data_path: Path,
    configs: tuple[Path, Path],
    tmp: Path,
    args: argparse.Namespace,
    sides: dict[tuple, str],
    runs: dict[str, list[dict[str, Any]]],
    *,
    threads: int,
    max_steps: int,
) -> None:
    """One run of every services-mode side at ``threads`` torch threads (0: torch's
    default), each appended to its ``runs``."""
    pyrsia_threads = threads or None  # None: train.py leaves torch's (the launcher's) default
    for (n, prio, rb, mt, st), side in sides.items():
        print(
            f"[{name}] Pyrsia pipeline, {n} NN-worker rank(s) x {threads or 'default'} torch "
            f"thread(s), {st}, {rank_rows(n, rb)}-row batches per "
            f"rank, services at {prio} CPU priority"
            f"{'' if mt == 'on' else ', NN worker malloc untuned'}"
            f"{oversubscribed(n * (threads or rank_threads(n)))} ...",
            flush=True,
        )
        runs[side].append(
            run_pyrsia(
                data_path,
                configs,
                tmp,
                threads=pyrsia_threads,
                staleness=args.staleness if st == "tuned" else None,
                tuned=st == "tuned",
                max_steps=max_steps,
                profile=args.profile,
                nn_workers=n,
                mixed_precision=args.mixed_precision,
                cpu_priority=prio,
                rank_batch=rb,
                fused_adam=args.fused_adam,
                malloc_tuning=mt,
            )
        )


def pyrsia_side(
    nn_workers: int,
    cpu_priority: str = "normal",
    rank_batch: str = "whole",
    malloc_tuning: str = "on",
    settings: str = "defaults",
) -> str:
    """The runs key of Pyrsia with ``nn_workers`` NN-worker ranks, services at ``cpu_priority``,
    ``rank_batch`` batches (``whole`` or ``split``, see the module's docstring), the NN
    worker's ``malloc_tuning`` and train.py's DataLoader ``settings`` (suffix ``_tuned``)."""
    side = "pyrsia" if nn_workers == 1 else f"pyrsia_{nn_workers}ranks"
    if nn_workers > 1 and rank_batch == "split":
        side += "_split"
    if cpu_priority != "normal":
        side += f"_{cpu_priority}_priority"
    side = side if malloc_tuning == "on" else f"{side}_malloc_off"
    return side if settings == "defaults" else f"{side}_{settings}"


def embedded_side(malloc_tuning: str = "on", settings: str = "defaults") -> str:
    """The runs key of Pyrsia in embedded mode with the process's ``malloc_tuning`` and
    train.py's DataLoader ``settings``."""
    side = EMBEDDED_SIDE if malloc_tuning == "on" else f"{EMBEDDED_SIDE}_malloc_off"
    return side if settings == "defaults" else f"{side}_{settings}"


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv, __doc__.split("\n\n")[0])
    quick_steps = 20
    if args.quick:
        args.threads, args.criteo_rows = args.threads[:1], 0
    results: list[dict[str, Any]] = []
    path = result_path("e2e_bench", args.json)

    def save_partial(running: dict[str, Any]) -> None:  # every finished round, on disk at once
        doc = {"quick": args.quick, "partial": True, "results": results, "running": running}
        write_json("e2e_bench", doc, path)

    with tempfile.TemporaryDirectory(prefix="pyrsia-e2e-") as tmp_name:
        tmp = Path(tmp_name) if args.log_dir is None else args.log_dir
        tmp.mkdir(parents=True, exist_ok=True)
        caps = dict(max_train_rows=quick_steps * BATCH, max_test_rows=8192) if args.quick else {}
        for name in args.datasets:
            if name == "criteo" and not args.criteo_rows:
                continue
            rows = dict(criteo_rows=args.criteo_rows) if name == "criteo" else caps
            prepared = e2e_data.prepare(name, tmp / f"{name}.npz", **rows)
            results.append(bench_dataset(name, prepared, tmp, args, 0, save_partial))
            if results[-1]["rounds"]["stopped_by"]:  # stopped part-way: report what finished
                break
        if not results:
            parser.error("nothing to run: --datasets criteo needs --criteo-rows > 0")
    print_report(results)
    write_json("e2e_bench", {"quick": args.quick, "results": results}, path)
    print(f"\nJSON: {path}")
    saved(save_chart(results, path))
    r = results[0]
    side = next(iter(r["medians"]))  # the first Pyrsia side: the README's code at defaults
    m = r["medians"][side]
    n = sum(q["side"] == side for q in r["pairs"])
    print(
        f"\nCPU: {cpu_model()}, {len(os.sched_getaffinity(0))} cores; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"Medians of {n} same-run pair(s), {r['dataset']}, side {side}:")
    print(
        f"RESULT pyrsia_samples_per_s={m['pyrsia_samples_per_s']:.1f} "
        f"baseline_samples_per_s={m['baseline_samples_per_s']:.1f} ratio={m['ratio']:.3f} "
        f"pyrsia_auc={m['pyrsia_auc']:.4f} baseline_auc={m['baseline_auc']:.4f}"
    )
    for peer, by_side in r.get("peer_medians", {}).items():  # Pyrsia ÷ each peer, same runs
        q = by_side[side]
        print(f"PEER {peer} pyrsia_vs_peer={q['ratio']:.3f} auc_gap={q['auc_gap']:+.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
