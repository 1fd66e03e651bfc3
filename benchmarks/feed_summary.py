"""The figures of one feed-rate run's steady window (``feed_rate.py``): the NN worker's
samples/s and CPU per batch (outside the dense step, per thread, per phase), every service's
CPU per batch (summed over its replicas, each replica kept) and how many NN workers one core
of each service feeds at this rate. Read from the train script's JSON marks and the
``/proc`` CPU sampler.
"""

from __future__ import annotations

from typing import Any

from e2e.procs import ENDED, CpuSampler, threads_window

SERVICES = ("embedding_ps", "embedding_worker", "data_loader")
REPLICATED = ("embedding_ps", "embedding_worker")  # CPU summed over their replicas


def summarize_run(
    res: dict[str, Any],
    sampler: CpuSampler,
    *,
    batch: int,
    dense: str,
    dense_ms: float,
    threads: int,
) -> dict[str, Any]:
    """The steady window's figures of one run (train script JSON + the sampled /proc CPU)."""
    (lo, a), (hi, b) = sorted(((int(k), v) for k, v in res["marks"].items()))
    if a is None or b is None:
        raise RuntimeError(f"the NN worker stopped before step {hi} of its steady window")
    batches, seconds = hi - lo, b["t"] - a["t"]
    samples = b["samples"] - a["samples"]
    threads_cpu = threads_window(b["threads_cpu_s"], a["threads_cpu_s"])
    nn_cpu = sum(threads_cpu.values())
    phase_cpu = {
        k: v["cpu_s"] - a["phases"].get(k, {}).get("cpu_s", 0.0) for k, v in b["phases"].items()
    }
    dense_cpu = _dense_cpu(dense, phase_cpu, threads_cpu)
    window = sampler.window(a["t"], b["t"])
    replicas = _replica_cpu(window, batches)
    services = {s: 1e3 * window[s]["cpu_s"] / batches for s in SERVICES if s in window}
    batches_per_s = batches / seconds
    feeds = {
        s: (1e3 / services[s]) / batches_per_s if services.get(s, 0) > 0 else float("inf")
        for s in ("embedding_worker", "embedding_ps")
    }
    return {
        "dense": dense,
        "dense_ms": dense_ms if dense == "sleep" else None,
        "batch": batch,
        "threads": threads,
        "steps": res["steps"],
        "window_steps": [lo, hi],
        "window_seconds": seconds,
        "samples_per_s": samples / seconds,
        "run_samples_per_s": res["samples_per_s"],
        "batches_per_s": batches_per_s,
        "nn_cpu_ms_per_batch": 1e3 * nn_cpu / batches,
        "nn_cpu_ms_outside_dense": 1e3 * (nn_cpu - dense_cpu) / batches,
        "nn_dense_cpu_ms": 1e3 * dense_cpu / batches,
        "nn_threads_cpu_ms": {k: 1e3 * v / batches for k, v in threads_cpu.items() if v > 0},
        "nn_phases_ms": _phases_ms(a, b, phase_cpu, batches),
        "services_cpu_ms_per_batch": services,
        "ps_shards_cpu_ms_per_batch": replicas["embedding_ps"],
        "ew_replicas_cpu_ms_per_batch": replicas["embedding_worker"],
        "nn_workers_fed_per_core": feeds,
        "cores_used": {k: v["cores"] for k, v in window.items()},
        "device": res.get("device", "cpu"),
    }


def _dense_cpu(dense: str, phase_cpu: dict[str, float], threads_cpu: dict[str, float]) -> float:
    """CPU seconds of the dense step: its phases, plus torch's intra-op threads (which work
    for the dense step only) unless the step is a sleep."""
    dense_phases = ("dense",) if dense == "sleep" else ("dense", "autograd", "dense_step")
    dense_cpu = sum(phase_cpu.get(k, 0.0) for k in dense_phases)
    if dense != "sleep":
        named = {"MainThread", "pyrsia-runtime", ENDED}
        dense_cpu += sum(
            v for k, v in threads_cpu.items() if k not in named and not k.startswith("pyrsia")
        )
    return dense_cpu


def _replica_cpu(window: dict[str, dict], batches: int) -> dict[str, dict[str, float]]:
    """CPU ms per batch of each replica of the replicated services; adds each service's
    sum over its replicas (seconds and cores) to ``window`` under the service's name."""
    replicas = {}
    for role in REPLICATED:
        replicas[role] = {
            k: 1e3 * v["cpu_s"] / batches for k, v in window.items() if k.startswith(f"{role}.")
        }
        window[role] = {
            "cpu_s": sum(v["cpu_s"] for k, v in window.items() if k in replicas[role]),
            "cores": sum(v["cores"] for k, v in window.items() if k in replicas[role]),
        }
    return replicas


def _phases_ms(a: dict, b: dict, phase_cpu: dict[str, float], batches: int) -> dict:
    """Wall and CPU ms per batch of each phase of the NN worker's step in the window."""
    return {
        k: {
            "wall": 1e3 * (v["wall_s"] - a["phases"].get(k, {}).get("wall_s", 0.0)) / batches,
            "cpu": 1e3 * phase_cpu[k] / batches,
        }
        for k, v in b["phases"].items()
    }
