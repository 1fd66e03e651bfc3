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

Same batches (batch size 1,024, same order: the NN worker hands them out in batch-id
order), same number of steps, same hyperparameters (``e2e/model.py``). samples/s is
training samples over the wall time of the training loop only, the first step excluded
on both sides (Pyrsia: measured inside train.py from the end of the first step to the
last gradients applied; start-up and evaluation are reported separately). Each side runs
at each ``--threads`` count and the best is kept. Data: the real Census-Income (KDD) set
(one epoch, test AUC on the test split; UCI, Lane & Kohavi 2000, CC BY 4.0) and a
Criteo-shaped synthetic set.

Also reported: each process's CPU share over the training window (``/proc``), the
services' ``/metrics`` latency means, the NN worker's CPU per thread, and where the
training thread's step goes, wall and CPU ms per step (waiting for the next looked-up
batch, forward, autograd, gradient send, dense optimizer step, final flush), next to the
baseline's step. On a shared machine compare the CPU columns and same-run ratios.
Ends with::

    RESULT pyrsia_samples_per_s=... baseline_samples_per_s=... ratio=... pyrsia_auc=... baseline_auc=...

    python benchmarks/e2e_bench.py [--quick] [--threads 1,2] [--nn-workers 1,2] [--repeats N]
                                   [--mixed-precision] [--fused-adam] [--datasets census,criteo]
                                   [--criteo-rows 200000] [--staleness 8] [--torchrec]
                                   [--modes services,embedded]
                                   [--malloc-tuning on,off]
                                   [--json F]

``--fused-adam`` steps Pyrsia's dense model with ``Adam(fused=True)`` (a faster dense step;
the same update): the issue's baseline, with the default ``Adam``, stays the yardstick, and
the baseline with fused Adam is run and reported beside it as a reference.

``--malloc-tuning on,off`` runs Pyrsia with and without the NN worker's heap tuning
(``PERSIA_MALLOC_TUNING``, ``pyrsia/shared/allocator.py``) in the same run; both sides
report their page faults per step.

``--modes services,embedded`` runs Pyrsia in services mode (the processes above) and in
embedded mode (``persia-launcher run --embedded``: the same train.py and data_loader.py, the
engines and the loader inside the NN worker's process; side ``pyrsia_embedded``) in the same
run; ``--modes embedded`` runs only the latter.

``--torchrec`` adds TorchRec's fused CPU embeddings (``torchrec_peer.py``) as a third side,
run and reported like the baseline (install it by hand, as that module says).

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
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import REPO, Cluster, write_json
from plots import saved

sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

from baseline import array_batches, train_single_process  # noqa: E402
from e2e import data as e2e_data  # noqa: E402
from e2e.model import (  # noqa: E402
    ADAGRAD_EPS,
    DENSE_LR,
    EMBEDDING_DIM,
    EMBEDDING_LR,
    INIT_RANGE,
    INITIAL_ACCUMULATOR,
    SEED,
    build_model,
)
from e2e.procs import CpuSampler, minor_faults, scrape_histograms  # noqa: E402
from e2e.report import print_report, save_chart  # noqa: E402
from torchrec_peer import TorchRecEmbeddings, torchrec_missing  # noqa: E402

from pyrsia.services.nn_worker.precision import cpu_computes_bf16  # noqa: E402
from pyrsia.services.nn_worker.step_clock import StepClock  # noqa: E402
from pyrsia.shared.constants import (  # noqa: E402
    ENV_MALLOC_TUNING,
    ROLE_EMBEDDING_PS,
    ROLE_EMBEDDING_WORKER,
)
from pyrsia.shared.cpu_priority import CPU_PRIORITIES  # noqa: E402
from tests.redis_server import free_port  # noqa: E402

E2E = REPO / "benchmarks" / "e2e"
BATCH = 1024
RANK_BATCHES = ("whole", "split")
RUN_TIMEOUT_S = 1800.0


# ------------------------------------------------------------------------------- Pyrsia
def rank_rows(nn_workers: int, rank_batch: str) -> int:
    """Rows in one rank's batch: ``BATCH`` (``whole``) or its 1 / ``nn_workers`` (``split``)."""
    return BATCH if rank_batch == "whole" else BATCH // nn_workers


def run_pyrsia(data_path: Path, configs: tuple[Path, Path], tmp: Path, *, threads: int,
               staleness: int, max_steps: int, profile: bool = False,
               mixed_precision: bool = False, nn_workers: int = 1,
               cpu_priority: str = "normal", rank_batch: str = "whole",
               fused_adam: bool = False, malloc_tuning: str = "on", batch: int | None = None,
               extra_env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One training run through the whole pipeline; train.py's JSON plus CPU, metrics, exits.

    ``cpu_priority``: the PS, embedding worker and data loaders' ``--cpu-priority``
    (``normal`` as the Procfiles start them, or ``background``).

    ``nn_workers`` NN-worker ranks (``--nproc-per-node``; ``threads`` torch threads each) and
    as many data loaders, loader ``i`` feeding rank ``i`` (batch ``b`` goes to rank ``b mod
    n``), as ``Procfile.multi`` runs them. ``rank_batch`` (``whole`` or ``split``): see the
    module's docstring. ``malloc_tuning`` (``on``, Pyrsia's default, or ``off``):
    ``PERSIA_MALLOC_TUNING`` of the NN worker (``pyrsia/shared/allocator.py``). ``batch``:
    rows per rank batch instead of ``rank_batch``'s; ``extra_env``: more ``E2E_*`` settings
    of train.py, over these (``benchmarks/rank_quality.py`` uses both).
    """
    batch = rank_rows(nn_workers, rank_batch) if batch is None else batch
    lr_scale = nn_workers if rank_batch == "whole" else 1
    result_path = tmp / f"result-{nn_workers}x{threads}-{time.monotonic_ns()}.json"
    env = {
        "E2E_DATA": str(data_path), "E2E_RESULT": str(result_path), "E2E_BATCH": str(batch),
        "E2E_THREADS": str(threads), "E2E_STALENESS": str(staleness),
        "E2E_MAX_STEPS": str(max_steps), "OMP_NUM_THREADS": str(threads),
        "E2E_MIXED_PRECISION": "1" if mixed_precision else "0",
        "E2E_DENSE_LR_SCALE": str(lr_scale), "E2E_FUSED_ADAM": "1" if fused_adam else "0",
        ENV_MALLOC_TUNING: "1" if malloc_tuning == "on" else "0",
        **(extra_env or {}),
    }  # fmt: skip
    if profile:
        env["E2E_PROFILE"] = str(tmp / f"train-{threads}.prof")
    flags = ["--embedding-config", str(configs[0]), "--global-config", str(configs[1]),
             "--port", "0", "--replica-index", "0", "--replica-size", "1",
             "--cpu-priority", cpu_priority]  # fmt: skip
    sampler = CpuSampler()
    t_launch = time.time()
    with Cluster(log_dir=tmp) as cluster:
        sampler.track("redis", cluster.redis.proc.pid)
        full_env = {**os.environ, **cluster.env, **env, "PYTHONUNBUFFERED": "1"}
        launcher = [sys.executable, "-m", "persia.launcher"]
        logs = {name: open(tmp / f"{name}-{threads}.log", "wb") for name in ("nn", "dl")}  # noqa: SIM115
        children: list[subprocess.Popen] = []
        try:
            # The NN worker and the data loader start first (they wait for the registry), so
            # their imports overlap the servers' start-up.
            nn = subprocess.Popen(
                [*launcher, "nn-worker", str(E2E / "train.py"), "--nproc-per-node",
                 str(nn_workers), "--master-port", str(free_port())],
                cwd=REPO, env={**full_env, "E2E_DDP_PORT": str(free_port())},
                stdout=logs["nn"], stderr=subprocess.STDOUT,
            )  # fmt: skip
            children.append(nn)
            sampler.track("nn_worker", nn.pid)
            loaders = []
            for i in range(nn_workers):
                loaders.append(subprocess.Popen(
                    [*launcher, "data-loader", "--exit-when-done", "--replica-index", str(i),
                     "--replica-size", str(nn_workers), "--cpu-priority", cpu_priority,
                     str(E2E / "data_loader.py")],
                    cwd=REPO, env=full_env, stdout=logs["dl"], stderr=subprocess.STDOUT,
                ))  # fmt: skip
                children.append(loaders[-1])
                name = "data_loader" if nn_workers == 1 else f"data_loader_{i}"
                sampler.track(name, loaders[-1].pid)
            ps = cluster.start(
                "pyrsia.services.embedding_ps", flags, role=ROLE_EMBEDDING_PS, wait_ready=False
            )
            sampler.track("embedding_ps", ps.proc.pid)
            ew = cluster.start(
                "pyrsia.services.embedding_worker",
                flags,
                role=ROLE_EMBEDDING_WORKER,
                wait_ready=False,
            )
            sampler.track("embedding_worker", ew.proc.pid)
            sampler.start()
            t_services = time.time()
            nn_code = nn.wait(timeout=RUN_TIMEOUT_S)
            dl_code = max((dl.wait(timeout=60) for dl in loaders), key=abs)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            for fh in logs.values():
                fh.close()
        metrics = {
            "embedding_worker": scrape_histograms(ew.url),
            "embedding_ps": scrape_histograms(ps.url),
        }
        sampler.stop()
        codes = {"nn_worker": nn_code, "data_loader": dl_code}
        codes.update(zip(("embedding_worker", "embedding_ps"), cluster.stop(), strict=True))
    bad = {k: v for k, v in codes.items() if v != 0}
    if bad or not result_path.exists():
        tail = (tmp / f"nn-{threads}.log").read_text(errors="replace")[-3000:]
        tail_dl = (tmp / f"dl-{threads}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(
            f"Pyrsia run failed, exit codes {codes}\n--- nn worker\n{tail}\n--- data loader\n{tail_dl}"
        )
    res = json.loads(result_path.read_text())
    if nn_workers > 1:  # each rank's own samples, steps, phases and thread CPU
        res["ranks"] = [
            json.loads(Path(f"{result_path}.rank{r}").read_text()) for r in range(nn_workers)
        ]
    res["startup_s"] = res["t_first"] - t_launch
    res["services_registered_s"] = t_services - t_launch
    res["ctx_ready_s"] = res["t_ready"] - t_launch
    res["cpu"] = sampler.window(res["t_first"], res["t_end"])
    res["cpu_s"] = sum(v["cpu_s"] for v in res["cpu"].values())
    res["metrics"] = metrics
    res["exit_codes"] = codes
    res["nn_workers"] = nn_workers
    res["cpu_priority"] = cpu_priority
    res["rank_batch"] = batch
    res["malloc_tuning"] = malloc_tuning
    return res


EMBEDDED_SIDE = "pyrsia_embedded"
MODES = ("services", "embedded")


def run_pyrsia_embedded(data_path: Path, configs: tuple[Path, Path], tmp: Path, *, threads: int,
                        staleness: int, max_steps: int, profile: bool = False,
                        fused_adam: bool = False) -> dict[str, Any]:  # fmt: skip
    """One training run in embedded mode, ``persia-launcher run --embedded``: train.py, the
    embedding PS and worker engines and data_loader.py in one process (no Redis, no servers).
    The same train.py and data_loader.py as :func:`run_pyrsia`, the same JSON."""
    result_path = tmp / f"result-embedded-{threads}-{time.monotonic_ns()}.json"
    env = {
        "E2E_DATA": str(data_path), "E2E_RESULT": str(result_path), "E2E_BATCH": str(BATCH),
        "E2E_THREADS": str(threads), "E2E_STALENESS": str(staleness),
        "E2E_MAX_STEPS": str(max_steps), "OMP_NUM_THREADS": str(threads),
        "E2E_MIXED_PRECISION": "0", "E2E_DENSE_LR_SCALE": "1",
        "E2E_FUSED_ADAM": "1" if fused_adam else "0", "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    if profile:
        env["E2E_PROFILE"] = str(tmp / f"train-embedded-{threads}.prof")
    log_path = tmp / f"embedded-{threads}.log"
    sampler = CpuSampler()
    t_launch = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "persia.launcher", "run", "--embedded", "--no-progress",
             "--nn-worker", str(E2E / "train.py"), "--data-loader", str(E2E / "data_loader.py"),
             "--embedding-config", str(configs[0]), "--global-config", str(configs[1])],
            cwd=REPO, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        sampler.track("nn_worker", proc.pid)  # the launcher and its one child
        sampler.start()
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            sampler.stop()
    if code != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"Pyrsia embedded run failed, exit code {code}\n{tail}")
    res = json.loads(result_path.read_text())
    res["startup_s"] = res["t_first"] - t_launch
    res["services_registered_s"] = 0.0  # no services
    res["ctx_ready_s"] = res["t_ready"] - t_launch
    res["cpu"] = sampler.window(res["t_first"], res["t_end"])
    res["cpu_s"] = sum(v["cpu_s"] for v in res["cpu"].values())
    res["metrics"] = {}
    res["exit_codes"] = {"nn_worker": code}
    res.update(nn_workers=1, cpu_priority="normal", rank_batch=BATCH, malloc_tuning="on",
               mode="embedded")  # fmt: skip
    return res


# ------------------------------------------------------------------------------- baseline
def run_baseline(data: dict[str, Any], *, threads: int, max_steps: int,
                 bf16: bool = False, torchrec: bool = False,
                 fused_adam: bool = False) -> dict[str, Any]:  # fmt: skip
    """The single-process PyTorch run on the same batches (``threads`` torch threads);
    with ``torchrec`` the TorchRec peer (its fused embeddings instead of ``nn.Embedding``),
    with ``fused_adam`` its dense model stepped by ``Adam(fused=True)``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    cpu: list[float] = []
    faults: list[int] = []
    clock = StepClock()

    def timed(batches):  # CPU seconds and page faults of this process over the timed steps
        it = iter(batches)
        first = next(it, None)
        if first is None:
            return
        yield first
        cpu.append(time.process_time())
        faults.append(minor_faults())
        yield from it
        cpu.append(time.process_time())
        faults.append(minor_faults())

    slot_sizes = [int(c) for c in data["cardinalities"]]
    factory = None
    if torchrec:

        def factory():  # built after train_single_process seeds torch, as the baseline's
            return TorchRecEmbeddings(slot_sizes, EMBEDDING_DIM, INIT_RANGE, lr=EMBEDDING_LR,
                                      eps=ADAGRAD_EPS,
                                      initial_accumulator_value=INITIAL_ACCUMULATOR)  # fmt: skip

    try:
        res = train_single_process(
            array_batches(data["train_cat_ids"], data["train_dense"], data["train_label"], BATCH),
            array_batches(data["test_cat_ids"], data["test_dense"], data["test_label"], 4096),
            slot_sizes=slot_sizes,
            dim=EMBEDDING_DIM,
            model_factory=lambda: build_model(len(data["slot_names"]), data["train_dense"].shape[1]),
            embedding_lr=EMBEDDING_LR, dense_lr=DENSE_LR,
            initial_accumulator_value=INITIAL_ACCUMULATOR,
            emb_initialization=INIT_RANGE, seed=SEED, max_steps=max_steps or None, progress=timed,
            autocast_dtype=torch.bfloat16 if bf16 else None, clock=clock,
            embedding_factory=factory, fused_adam=fused_adam,
        )  # fmt: skip
    finally:
        torch.set_num_threads(previous)
    res["threads"] = threads
    res["fused_adam"] = fused_adam
    res["phases"] = clock.snapshot()
    res["cpu_s"] = cpu[-1] - cpu[0] if len(cpu) == 2 else float("nan")
    res["page_faults"] = faults[-1] - faults[0] if len(faults) == 2 else 0
    res["first_losses"], res["last_losses"] = res["losses"][:3], res["losses"][-3:]
    del res["losses"]
    return res


# ------------------------------------------------------------------------------- report
def bench_dataset(name: str, data_path: Path, tmp: Path, args: argparse.Namespace,
                  max_steps: int) -> dict[str, Any]:  # fmt: skip
    data = e2e_data.load(data_path)
    configs = e2e_data.write_configs(data, tmp)
    sides = {
        (n, prio, rb, mt): pyrsia_side(n, prio, rb, mt)
        for n in args.nn_workers
        for prio in args.cpu_priority
        for rb in (args.rank_batch if n > 1 else ["whole"])  # one rank: the two are the same
        for mt in args.malloc_tuning
    }
    if "services" not in args.modes:
        sides = {}
    mode_sides = [*sides.values(), *([EMBEDDED_SIDE] if "embedded" in args.modes else [])]
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
    for _ in range(args.repeats):  # interleaved, so a load change hits both sides alike
        for threads in args.threads:
            if "embedded" in args.modes:
                print(f"[{name}] Pyrsia embedded (one process), {threads} torch thread(s) ...",
                      flush=True)  # fmt: skip
                runs[EMBEDDED_SIDE].append(run_pyrsia_embedded(
                    data_path, configs, tmp, threads=threads, staleness=args.staleness,
                    max_steps=max_steps, profile=args.profile, fused_adam=args.fused_adam,
                ))  # fmt: skip
            for (n, prio, rb, mt), side in sides.items():
                print(f"[{name}] Pyrsia pipeline, {n} NN-worker rank(s) x {threads} torch "
                      f"thread(s), {rank_rows(n, rb)}-row batches per "
                      f"rank, services at {prio} CPU priority"
                      f"{'' if mt == 'on' else ', NN worker malloc untuned'} ...", flush=True)  # fmt: skip
                runs[side].append(run_pyrsia(data_path, configs, tmp, threads=threads,
                                             staleness=args.staleness, max_steps=max_steps,
                                             profile=args.profile, nn_workers=n,
                                             mixed_precision=args.mixed_precision,
                                             cpu_priority=prio, rank_batch=rb,
                                             fused_adam=args.fused_adam,
                                             malloc_tuning=mt))  # fmt: skip
            print(f"[{name}] baseline, {threads} torch thread(s) ...", flush=True)
            runs["baseline"].append(run_baseline(data, threads=threads, max_steps=max_steps))
            if args.torchrec:
                print(f"[{name}] TorchRec peer, {threads} torch thread(s) ...", flush=True)
                runs["torchrec"].append(
                    run_baseline(data, threads=threads, max_steps=max_steps, torchrec=True)
                )
            if args.fused_adam:
                print(f"[{name}] baseline with fused Adam (reference) ...", flush=True)
                runs["baseline_fused_adam"].append(
                    run_baseline(data, threads=threads, max_steps=max_steps, fused_adam=True)
                )
            if args.mixed_precision:
                print(f"[{name}] baseline under bf16 autocast (reference) ...", flush=True)
                runs["baseline_bf16"].append(
                    run_baseline(data, threads=threads, max_steps=max_steps, bf16=True)
                )
    best = {k: max(v, key=lambda r: r["samples_per_s"]) for k, v in runs.items()}
    b = best["baseline"]
    pyrsia_sides = mode_sides
    p = best[pyrsia_sides[0]]
    pairs = [  # each Pyrsia run against the baseline run of the same repeat and threads
        {"side": side, "nn_workers": pr["nn_workers"], "threads": pr["threads"],
         "ratio": pr["samples_per_s"] / br["samples_per_s"], "auc_gap": pr["auc"] - br["auc"]}
        for side in pyrsia_sides
        for pr, br in zip(runs[side], runs["baseline"], strict=True)
    ]  # fmt: skip
    for side in pyrsia_sides:  # split rank batches: more, smaller batches, the same rows
        if best[side]["samples"] != b["samples"]:
            raise RuntimeError(
                f"{name}: {side} trained {best[side]['samples']} rows, the baseline {b['samples']}"
            )
    return {
        "dataset": name, "train_rows": len(data["train_label"]), "test_rows": len(data["test_label"]),
        "slots": len(data["slot_names"]), "dense": int(data["train_dense"].shape[1]),
        "batch_size": BATCH, "steps": p["steps"], "runs": runs, "pyrsia": p, "baseline": b,
        "ratio": p["samples_per_s"] / b["samples_per_s"], "pairs": pairs,
        "pyrsia_sides": {side: best[side] for side in pyrsia_sides},
        "ratios": {side: best[side]["samples_per_s"] / b["samples_per_s"] for side in pyrsia_sides},
        "mixed_precision": args.mixed_precision, "load_average": os.getloadavg(),
        **({"torchrec": best["torchrec"],
            "torchrec_pairs": [
                {"threads": tr["threads"], "ratio": tr["samples_per_s"] / br["samples_per_s"],
                 "auc_gap": tr["auc"] - br["auc"]}
                for tr, br in zip(runs["torchrec"], runs["baseline"], strict=True)]}
           if args.torchrec else {}),
        **({"baseline_bf16": best["baseline_bf16"],
            "ratio_vs_bf16_baseline": p["samples_per_s"] / best["baseline_bf16"]["samples_per_s"]}
           if args.mixed_precision else {}),
        **({"baseline_fused_adam": best["baseline_fused_adam"],
            "ratio_vs_fused_adam_baseline":
                p["samples_per_s"] / best["baseline_fused_adam"]["samples_per_s"],
            "fused_adam_pairs": [
                {"threads": br["threads"], "ratio": pr["samples_per_s"] / br["samples_per_s"],
                 "auc_gap": pr["auc"] - br["auc"]}
                for pr, br in zip(runs[pyrsia_sides[0]], runs["baseline_fused_adam"], strict=True)]}
           if args.fused_adam else {}),
    }  # fmt: skip


def pyrsia_side(nn_workers: int, cpu_priority: str = "normal", rank_batch: str = "whole",
                malloc_tuning: str = "on") -> str:  # fmt: skip
    """The runs key of Pyrsia with ``nn_workers`` NN-worker ranks, services at ``cpu_priority``,
    ``rank_batch`` batches (``whole`` or ``split``, see the module's docstring) and the NN
    worker's ``malloc_tuning``."""
    side = "pyrsia" if nn_workers == 1 else f"pyrsia_{nn_workers}ranks"
    if nn_workers > 1 and rank_batch == "split":
        side += "_split"
    if cpu_priority != "normal":
        side += f"_{cpu_priority}_priority"
    return side if malloc_tuning == "on" else f"{side}_malloc_off"


def choice_list(
    parser: argparse.ArgumentParser, flag: str, value: str, choices: tuple[str, ...]
) -> list[str]:
    """``value`` split at commas: distinct members of ``choices``, at least one (else exit 2)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not set(items) <= set(choices) or len(set(items)) != len(items):
        parser.error(f"{flag}: expected distinct values among {choices}")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny smoke run (20 steps, 1 thread, < 60 s)"
    )
    parser.add_argument(
        "--threads", default="1,2", help="torch thread counts to try on each side (default 1,2)"
    )
    parser.add_argument(
        "--criteo-rows",
        type=int,
        default=200_000,
        help="training rows of the Criteo-shaped set (0 skips it; default 200,000)",
    )
    parser.add_argument(
        "--datasets", default="census,criteo",
        help="which data sets to run, in this order (default census,criteo; the RESULT line "
        "reports the first)",
    )  # fmt: skip
    parser.add_argument(
        "--staleness", type=int, default=8, help="embedding staleness bound of the NN worker"
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep the data, configs and every process's log here (default: a temp dir)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile train.py's training loop into --log-dir/train-<threads>.prof",
    )
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="Pyrsia with mixed_precision=True (bf16 autocast on CPU); the fp32 baseline stays "
        "the yardstick, a bf16-autocast baseline is reported beside it",
    )
    parser.add_argument(
        "--fused-adam",
        action="store_true",
        help="Pyrsia's dense model stepped by Adam(fused=True); the default-Adam baseline stays "
        "the yardstick, a fused-Adam baseline is reported beside it",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="run each side this many times (interleaved)"
    )
    parser.add_argument(
        "--nn-workers",
        default="1",
        help="NN-worker rank counts to run Pyrsia with, each with as many data loaders "
        "(default 1; e.g. 1,2: both in the same run; the first is the RESULT line's)",
    )
    parser.add_argument(
        "--cpu-priority",
        default="normal",
        help="the services' --cpu-priority (PS, embedding worker, data loaders), one or more of "
        "normal,background (default normal, as the Procfiles start them; "
        "normal,background runs both in the same run)",
    )
    parser.add_argument(
        "--rank-batch",
        default="whole",
        help="with several ranks, each rank's batch: whole (1,024 rows per rank, the dense lr "
        "scaled by the ranks; the default) or split (the global batch held at 1,024, each rank "
        "1,024 / ranks rows, the dense lr unscaled); whole,split runs both",
    )
    parser.add_argument(
        "--malloc-tuning",
        default="on",
        help="the NN worker's PERSIA_MALLOC_TUNING, one or more of on,off (default on, "
        "Pyrsia's default: freed heap memory kept for reuse; on,off runs both in the same run)",
    )
    parser.add_argument(
        "--modes",
        default="services",
        help="how Pyrsia runs, one or more of services,embedded (default services: the PS, "
        "embedding worker, NN worker and data loader as processes; embedded: persia-launcher "
        "run --embedded, one process; services,embedded runs both, side pyrsia_embedded)",
    )
    parser.add_argument(
        "--torchrec",
        action="store_true",
        help="also run TorchRec's fused CPU embeddings as a single-process peer "
        "(benchmarks/torchrec_peer.py; TorchRec installed by hand)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the JSON here (default bench_results/)"
    )
    args = parser.parse_args(argv)  # fmt: skip
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
        if not args.threads or min(args.threads) < 1:
            raise ValueError
    except ValueError:
        parser.error(
            f"--threads: expected positive integers separated by commas, got {args.threads!r}"
        )
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not args.datasets or not set(args.datasets) <= set(e2e_data.DATASETS):
        parser.error(f"--datasets: expected a comma-separated subset of {e2e_data.DATASETS}")
    try:
        args.nn_workers = [int(t) for t in args.nn_workers.split(",")]
        if (
            not args.nn_workers
            or min(args.nn_workers) < 1
            or len(set(args.nn_workers)) != len(args.nn_workers)
        ):
            raise ValueError
    except ValueError:
        parser.error(
            f"--nn-workers: expected distinct positive integers separated by commas, got {args.nn_workers!r}"
        )
    args.cpu_priority = choice_list(parser, "--cpu-priority", args.cpu_priority, CPU_PRIORITIES)
    args.rank_batch = choice_list(parser, "--rank-batch", args.rank_batch, RANK_BATCHES)
    args.malloc_tuning = choice_list(parser, "--malloc-tuning", args.malloc_tuning, ("on", "off"))
    args.modes = choice_list(parser, "--modes", args.modes, MODES)
    if "split" in args.rank_batch and (bad := [n for n in args.nn_workers if BATCH % n]):
        parser.error(f"--rank-batch split: the ranks must divide the batch {BATCH}, got {bad}")
    if args.criteo_rows < 0 or args.staleness < 1 or args.repeats < 1:
        parser.error("--criteo-rows: expected >= 0; --staleness, --repeats: expected >= 1")
    if args.torchrec and (missing := torchrec_missing()) is not None:
        parser.error(f"--torchrec: {missing}")
    quick_steps = 20
    if args.quick:
        args.threads, args.criteo_rows = args.threads[:1], 0
    results = []
    with tempfile.TemporaryDirectory(prefix="pyrsia-e2e-") as tmp_name:
        tmp = Path(tmp_name) if args.log_dir is None else args.log_dir
        tmp.mkdir(parents=True, exist_ok=True)
        caps = dict(max_train_rows=quick_steps * BATCH, max_test_rows=8192) if args.quick else {}
        for name in args.datasets:
            if name == "census":
                census = e2e_data.prepare("census", tmp / "census.npz", **caps)
                results.append(bench_dataset("census", census, tmp, args, 0))
            elif args.criteo_rows:
                criteo = e2e_data.prepare(
                    "criteo", tmp / "criteo.npz", criteo_rows=args.criteo_rows
                )
                results.append(bench_dataset("criteo", criteo, tmp, args, 0))
        if not results:
            parser.error("nothing to run: --datasets criteo needs --criteo-rows > 0")
    print_report(results)
    path = write_json("e2e_bench", {"quick": args.quick, "results": results}, args.json)
    print(f"\nJSON: {path}")
    saved(save_chart(results, path))
    r = results[0]
    print(
        f"RESULT pyrsia_samples_per_s={r['pyrsia']['samples_per_s']:.1f} "
        f"baseline_samples_per_s={r['baseline']['samples_per_s']:.1f} ratio={r['ratio']:.3f} "
        f"pyrsia_auc={r['pyrsia']['auc']:.4f} baseline_auc={r['baseline']['auc']:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
