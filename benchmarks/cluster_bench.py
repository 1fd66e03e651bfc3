"""Census job across simulated hosts: throughput and AUC against round-trip time and bandwidth.

Five hosts (Linux network namespaces on a bridge, see ``tests/cluster/netns.py``): Redis,
one embedding PS, one embedding worker, one NN-worker rank, one data loader, each on its
own address, the job of ``benchmarks/e2e`` (``train.py`` / ``data_loader.py``, Census-Income,
batch 1024). Between hosts:

- bandwidth: ``tc tbf`` on both ends of every host's link (``--rates``, default 1gbit and
  10gbit);
- round-trip time: ``tests/cluster/delay_proxy.py`` in every server host, holding each chunk
  half the RTT in each direction; the servers advertise the proxy's address, so every
  request between hosts (data loader -> worker and NN ingress, NN worker -> worker, worker
  -> PS, everyone -> Redis) crosses it. The RTT each setting gives is *measured* (a
  64-byte ping-pong through the proxy, median and p90) and printed beside the target; the
  proxy's own cost is the ``0 ms via proxy`` row. RTT 0 runs without a proxy.

The embedding staleness (gradients in flight) is 8 (the e2e benchmark's default); with
``--staleness-low`` (default 1) each RTT runs again at that bound, at the highest rate: the
difference is how much the prefetch and the staleness window hide. One NN-worker rank:
the proxy relays TCP it can see a port for, and gloo's all-reduce between two ranks would
bypass it. Prints a table and writes the JSON (``--out``, else
``bench_results/cluster_bench-<time>.json``) and two PNGs beside it (``benchmarks/plots.py``):
samples/s, and the NN worker's wait per step, against the measured RTT, one line per link
rate and staleness. ``--plot-from JSON`` draws the PNGs of a saved run again.

Needs root (network namespaces); ``--quick`` trains on 20k rows for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import REPO, write_json

sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

from cluster_links import (  # noqa: E402
    calibrate,
    measure_gbits,
    measure_rtt,
    start_probe_servers,
    start_proxies,
    stop,
)
from e2e import data as e2e_data  # noqa: E402

from tests.cluster.job import ClusterJob, Layout  # noqa: E402
from tests.cluster.netns import Network, unavailable_reason  # noqa: E402
from tests.service_procs import cpu_seconds  # noqa: E402

E2E = REPO / "benchmarks" / "e2e"
LAYOUT = Layout(ps=1, ew=1, dl=1, nn=1)


class CensusJob(ClusterJob):
    """The e2e benchmark's job on the cluster's hosts; ``via_proxy``: advertise ``<host>-0``."""

    def __init__(self, *args, configs, data_path, result_path, staleness, via_proxy, **kw):
        super().__init__(*args, **kw)
        self.configs, self.data_path, self.result_path = configs, data_path, result_path
        self.staleness, self.via_proxy = staleness, via_proxy

    def env(self, host: str) -> dict[str, str]:
        env = super().env(host)
        name = f"{host}-0" if self.via_proxy else host
        redis = "redis-0" if self.via_proxy else "redis"
        env.update(
            PERSIA_ADVERTISE_HOST=name,
            PERSIA_REDIS_URL=f"redis://{redis}:6379/0",
            PERSIA_EMBEDDING_CONFIG=str(self.configs[0]),
            PERSIA_GLOBAL_CONFIG=str(self.configs[1]),
            PERSIA_NN_WORKER_ENTRY=str(E2E / "train.py"),
            PERSIA_DATALOADER_ENTRY=str(E2E / "data_loader.py"),
            E2E_DATA=str(self.data_path),
            E2E_RESULT=str(self.result_path),
            E2E_BATCH="1024",
            E2E_THREADS="1",
            E2E_STALENESS=str(self.staleness),
            E2E_REPRODUCIBLE="1",  # batch-id order, 16 ingress batches, as it measured before
            E2E_BUFFER="16",
        )
        return env

    def argv(self, host: str) -> list[str]:
        argv = super().argv(host)
        return [*argv, "--exit-when-done"] if host.startswith("dl") else argv


def run_one(net, work, configs, data_path, *, rtt_ms, rate, staleness, via_proxy) -> dict:
    for host in LAYOUT.hosts():
        net.shape(host, rate)
    delay, p50, p90 = calibrate(net, rtt_ms) if via_proxy else (0.0, *measure_rtt(net, False))
    gbits = measure_gbits(net) if not via_proxy else None
    proxies = start_proxies(net, delay) if via_proxy else []
    name = f"r{rtt_ms}-{rate}-s{staleness}-{'p' if via_proxy else 'd'}"
    result_path = work / f"{name}.json"
    job = CensusJob(
        net,
        work,
        LAYOUT,
        name=name,
        configs=configs,
        data_path=data_path,
        result_path=result_path,
        staleness=staleness,
        via_proxy=via_proxy,
    )
    try:
        job.start()
        outcome = job.wait(timeout_s=600)
        proxy_cpu = sum(cpu_seconds(p.pid) for p in proxies if p.poll() is None)
    finally:
        job.stop()
        stop(proxies)
    if not result_path.exists():
        raise RuntimeError(f"{name}: no result\n{outcome.tail()}")
    res = json.loads(result_path.read_text())
    return {
        "rtt_target_ms": rtt_ms,
        "via_proxy": via_proxy,
        "rate": rate,
        "staleness": staleness,
        "rtt_p50_ms": round(p50, 3),
        "rtt_p90_ms": round(p90, 3),
        "one_way_delay_ms": round(delay, 3),
        "bulk_gbit_s": None if gbits is None else round(gbits, 2),
        "samples_per_s": round(res["samples_per_s"], 1),
        "auc": round(res["auc"], 4),
        "train_seconds": round(res["train_seconds"], 2),
        "proxy_cpu_s": round(proxy_cpu, 1),
        "wait_ms_p50": round(res["wait_ms"]["p50"], 2),
        "wait_ms_p90": round(res["wait_ms"]["p90"], 2),
    }


def print_table(rows: list[dict]) -> None:
    head = (
        "RTT target",
        "RTT p50/p90 ms",
        "rate",
        "stale",
        "samples/s",
        "vs 0 ms relay",
        "AUC",
        "wait p50/p90 ms",
        "relay CPU s",
    )
    print(" | ".join(head))
    for r in rows:
        # the fair base: the same rate and staleness through the relay at 0 ms (its CPU cost)
        base = next(
            (
                b["samples_per_s"]
                for b in rows
                if b["via_proxy"]
                and b["rtt_target_ms"] == 0
                and b["rate"] == r["rate"]
                and b["staleness"] == r["staleness"]
            ),
            rows[0]["samples_per_s"],
        )
        target = f"{r['rtt_target_ms']} ms" + (" via proxy" if r["via_proxy"] else "")
        print(
            " | ".join(
                [
                    target,
                    f"{r['rtt_p50_ms']:.2f}/{r['rtt_p90_ms']:.2f}",
                    r["rate"],
                    str(r["staleness"]),
                    f"{r['samples_per_s']:.0f}",
                    f"{r['samples_per_s'] / base:.2f}",
                    f"{r['auc']:.4f}",
                    f"{r['wait_ms_p50']:.1f}/{r['wait_ms_p90']:.1f}",
                    f"{r['proxy_cpu_s']:.1f}",
                ]
            )
        )


def save_plots(json_path: Path, rows: list[dict]) -> list[Path]:
    """``<json>.png`` (samples/s) and ``<json>-wait.png`` (the training loop's wait for its
    next looked-up batch, p50) against the measured RTT p50: one line per link rate and
    staleness through the relay, one point per rate for the direct rows. None written
    without matplotlib (``plots`` says so)."""
    from plots import png_beside, save_line_chart

    def series(key: str) -> dict[str, tuple[list[float], list[float]]]:
        out: dict[str, tuple[list[float], list[float]]] = {}
        for r in sorted(rows, key=lambda r: r["rtt_p50_ms"]):
            via = "relay" if r["via_proxy"] else "direct"
            name = f"{r['rate']}, staleness {r['staleness']}, {via}"
            xs, ys = out.setdefault(name, ([], []))
            xs.append(r["rtt_p50_ms"])
            ys.append(r[key])
        return out

    png = png_beside(json_path)
    written = [
        save_line_chart(
            png,
            series("samples_per_s"),
            xlabel="measured RTT p50 (ms)",
            ylabel="samples/s",
            title="Census across hosts: throughput against RTT",
        ),
        save_line_chart(
            png.with_name(f"{png.stem}-wait.png"),
            series("wait_ms_p50"),
            xlabel="measured RTT p50 (ms)",
            ylabel="NN wait per step, p50 (ms)",
            title="Census across hosts: wait for the next batch against RTT",
        ),
    ]
    return [p for p in written if p is not None]


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser (for its ``error``) and the parsed command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", default="0,0.5,2,5", help="round-trip times (ms)")
    parser.add_argument("--rates", default="10gbit,1gbit", help="link rates (tc syntax)")
    parser.add_argument("--staleness", type=int, default=8)
    parser.add_argument("--staleness-low", type=int, default=1, help="0: skip those runs")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20k training rows, RTT 0 and the second RTT, the first rate",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON's path (default bench_results/cluster_bench-<time>.json)",
    )
    parser.add_argument(
        "--plot-from",
        type=Path,
        default=None,
        metavar="JSON",
        help="only draw the PNGs of a saved run (beside that JSON)",
    )
    return parser, parser.parse_args(argv)


def plot_from(parser: argparse.ArgumentParser, saved_json: Path) -> None:
    """``--plot-from``: the saved run's table and its PNGs, drawn beside ``saved_json``."""
    try:
        doc = json.loads(saved_json.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"--plot-from: cannot read {saved_json} as JSON: {exc}")
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        parser.error(f"--plot-from: {saved_json} is not a cluster_bench JSON (no rows)")
    print_table(doc["rows"])
    for path in save_plots(saved_json, doc["rows"]):
        print(f"wrote {path}")


def run_plan(
    work: Path,
    configs: tuple[Path, Path],
    data_path: Path,
    rtts: list[float],
    rates: list[str],
    staleness: int,
    staleness_low: int,
) -> list[dict[str, Any]]:
    """Every run of the plan in the namespaced hosts, with the echo and sink servers up: per
    rate, direct and relayed at RTT 0, relayed at each RTT > 0; then ``staleness_low`` (when
    not 0) at each RTT on the first rate. Each row is printed as JSON as it comes."""
    rows = []
    with Network(LAYOUT.hosts()) as net:
        for host in LAYOUT.hosts():
            net.add_address(host)
        probes = start_probe_servers(net)
        plan = []
        for rate in rates:
            plan.append((0.0, rate, staleness, False))
            plan.append((0.0, rate, staleness, True))
            plan += [(rtt, rate, staleness, True) for rtt in rtts if rtt > 0]
        if staleness_low:
            plan += [(rtt, rates[0], staleness_low, True) for rtt in rtts]
        for rtt, rate, stale, via_proxy in plan:
            row = run_one(
                net,
                work,
                configs,
                data_path,
                rtt_ms=rtt,
                rate=rate,
                staleness=stale,
                via_proxy=via_proxy,
            )
            print(json.dumps(row), flush=True)
            rows.append(row)
        stop(probes)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    if args.plot_from is not None:
        plot_from(parser, args.plot_from)
        return 0
    reason = unavailable_reason()
    if reason is not None:
        print(f"cluster_bench: skipped: {reason}")
        return 0
    rtts = [float(x) for x in args.rtt_ms.split(",")]
    rates = args.rates.split(",")
    if args.quick:
        rtts, rates, args.staleness_low = rtts[:2], rates[:1], 0
    work = Path(tempfile.mkdtemp(prefix="pyrsia-cluster-bench-"))
    data_path = e2e_data.prepare(
        "census",
        work / "census.npz",
        max_train_rows=20_000 if args.quick else None,
        max_test_rows=20_000 if args.quick else None,
    )
    configs = e2e_data.write_configs(e2e_data.load(data_path), work)
    rows = run_plan(work, configs, data_path, rtts, rates, args.staleness, args.staleness_low)
    print()
    print_table(rows)
    doc = {
        "benchmark": "cluster_bench",
        "layout": LAYOUT.hosts(),
        "rows": rows,
        "median_samples_per_s": statistics.median(r["samples_per_s"] for r in rows),
    }
    print(json.dumps(doc))
    json_path = write_json("cluster_bench", doc, args.out)
    print(f"wrote {json_path}")
    for path in save_plots(json_path, rows):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
