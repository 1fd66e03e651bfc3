"""``persia-launcher serve`` latency and throughput, with a same-run in-process baseline.

An Adult-shaped model (8 summed slots of dim 8, 5 dense features, the example's DNN) is
exported with a PS checkpoint, then served without Redis: one Infer PS replica at
``infer_config.servers`` and ``persia-launcher serve`` with its private embedding worker.

    serve msgpack   POST /predict, numpy arrays in msgpack, one request at a time / 4 in flight
    serve json      the same body as JSON lists, one at a time
    baseline        in this process: InferCtx.get_embedding_from_data against the same embedding
                    worker + the loaded dense model (PERSIA's TorchServe-handler path, no endpoint)

Every mode looks up the same ids through the same worker and PS, so the ratio is the cost of
the endpoint (HTTP hop, parsing, validation). The machine is shared: compare ratios.

    python benchmarks/serve_bench.py [--quick]
    RESULT serve_p50_ms_b64=... baseline_p50_ms_b64=... serve_samples_per_s_b1024=...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import REPO, ServiceProc, fmt_rate, print_table, write_json
from plots import save_bar_chart, saved

sys.path.insert(0, str(REPO / "examples" / "adult_income"))
from model import DNN  # noqa: E402

from persia.ctx import InferCtx  # noqa: E402
from persia.embedding.data import IDTypeFeatureWithSingleID, NonIDTypeFeature, PersiaBatch  # noqa: E402
from persia.serving import export_model, load_model  # noqa: E402
from pyrsia.services.embedding_ps.engine import EmbeddingStore  # noqa: E402
from pyrsia.shared.codec import packb, unpackb  # noqa: E402
from pyrsia.shared.config import parse_embedding_config  # noqa: E402
from pyrsia.shared.embedding_spec import AdagradSpec  # noqa: E402
from pyrsia.shared.wire.serve import PredictAnswer, PredictRequest  # noqa: E402
from tests.redis_server import free_port  # noqa: E402

SLOTS = [f"s{i}" for i in range(8)]
VOCAB = 200
CONCURRENCY = 4


def _prepare(root: Path) -> Path:
    cfg = {"slots_config": {s: {"dim": 8} for s in SLOTS}}
    (root / "embedding_config.yml").write_text(json.dumps(cfg))
    schema = parse_embedding_config(cfg)
    store = EmbeddingStore(100_000, optimizer=AdagradSpec(lr=0.1))
    for prefix in schema.slot_prefixes().values():
        ids = np.arange(VOCAB, dtype=np.uint64) % np.uint64((1 << 56) - 1) + np.uint64(prefix)
        store.lookup(ids, 8, train=True)
    store.dump(root / "ckpt", 0, 1)
    examples = ([torch.randn(4, 5)], [torch.randn(4, 8) for _ in SLOTS])
    return export_model(
        root / "model",
        DNN(),
        example_inputs=examples,
        embedding_config=root / "embedding_config.yml",
        embedding_checkpoint_dir=root / "ckpt",
        non_id_names=["dense"],
    )


def _batch(n: int, rng: np.random.Generator) -> PersiaBatch:
    return PersiaBatch(
        [IDTypeFeatureWithSingleID(s, rng.integers(0, VOCAB, n).astype(np.uint64)) for s in SLOTS],
        non_id_type_features=[NonIDTypeFeature(rng.normal(size=(n, 5)).astype(np.float32))],
        requires_grad=False,
    )


def _body(batch: PersiaBatch, as_json: bool) -> bytes:
    """The /predict body a client sends (pyrsia.shared.wire.serve.PredictRequest; ids in CSR form)."""
    dense = np.asarray(batch.non_id_type_features[0].data)
    request = PredictRequest(batch.batch_size, (("dense", dense),), batch.id_part())
    body = request.to_wire(as_json=as_json)
    return json.dumps(body).encode() if as_json else packb(body)


async def _serve_run(
    url: str, bodies: list[bytes], as_json: bool, concurrency: int
) -> tuple[list[float], float]:
    import aiohttp

    kind = "application/json" if as_json else "application/msgpack"
    latencies: list[float] = []
    queue = list(bodies)
    async with aiohttp.ClientSession(headers={"Content-Type": kind}) as session:

        async def one_client() -> None:
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                async with session.post(f"{url}/predict", data=body) as resp:
                    raw = await resp.read()
                    assert resp.status == 200, raw[:300]
                    PredictAnswer.from_wire(json.loads(raw) if as_json else unpackb(raw))
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return latencies, time.perf_counter() - started


def _row(mode: str, batch: int, lat: list[float], wall: float) -> dict:
    lat_ms = sorted(x * 1000 for x in lat)
    p99 = lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))]
    return {
        "mode": mode,
        "batch": batch,
        "requests": len(lat),
        "p50_ms": round(statistics.median(lat_ms), 2),
        "p99_ms": round(p99, 2),
        "samples_per_s": len(lat) * batch / wall,
    }


def measure_size(
    ctx: InferCtx, model: Any, url: str, batches: list[PersiaBatch], size: int
) -> list[dict]:
    """The rows of one batch size: the in-process handler path (the baseline), then the
    served model over msgpack at 1 and ``CONCURRENCY`` clients, and over JSON up to 64."""
    rows = []
    lat = []
    t_all = time.perf_counter()
    for b in batches:  # baseline: the handler path in this process
        t0 = time.perf_counter()
        looked = ctx.get_embedding_from_data(b)
        non_id, emb, _ = ctx.prepare_features(looked)
        model.predict(non_id, emb)
        lat.append(time.perf_counter() - t0)
    rows.append(_row("baseline in-process", size, lat, time.perf_counter() - t_all))
    bodies = [_body(b, False) for b in batches]
    lat, wall = asyncio.run(_serve_run(url, bodies, False, 1))
    rows.append(_row("serve msgpack", size, lat, wall))
    lat, wall = asyncio.run(_serve_run(url, bodies, False, CONCURRENCY))
    rows.append(_row(f"serve msgpack x{CONCURRENCY}", size, lat, wall))
    if size <= 64:
        lat, wall = asyncio.run(_serve_run(url, [_body(b, True) for b in batches], True, 1))
        rows.append(_row("serve json", size, lat, wall))
    return rows


def report(rows: list[dict], quick: bool) -> None:
    """The table, the JSON, the p50 chart and the RESULT line of the measured ``rows``."""
    for r in rows:
        r["rate"] = fmt_rate(r["samples_per_s"])
    print_table(
        rows,
        [
            ("mode", "mode"),
            ("batch", "batch"),
            ("requests", "requests"),
            ("p50_ms", "p50 ms"),
            ("p99_ms", "p99 ms"),
            ("rate", "samples/s"),
        ],
    )
    path = write_json("serve_bench", {"rows": rows, "concurrency": CONCURRENCY, "quick": quick})
    print(f"json: {path}")
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    sizes = sorted({r["batch"] for r in rows})
    p50 = {
        (m, b): next((r["p50_ms"] for r in rows if r["mode"] == m and r["batch"] == b), None)
        for m in modes
        for b in sizes
    }
    saved(
        save_bar_chart(
            path,
            [f"batch {b}" for b in sizes],
            {m: [p50[m, b] for b in sizes] for m in modes},
            title="Serving latency (p50)",
            ylabel="ms",
            logy=True,
        )
    )

    def pick(mode: str, batch: int, key: str) -> float:
        return next(r[key] for r in rows if r["mode"] == mode and r["batch"] == batch)

    print(
        f"RESULT serve_p50_ms_b64={pick('serve msgpack', 64, 'p50_ms')} "
        f"baseline_p50_ms_b64={pick('baseline in-process', 64, 'p50_ms')} "
        f"serve_samples_per_s_b1024={pick(f'serve msgpack x{CONCURRENCY}', 1024, 'samples_per_s'):.0f} "
        f"baseline_samples_per_s_b1024={pick('baseline in-process', 1024, 'samples_per_s'):.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few requests (smoke test)")
    args = parser.parse_args()
    n_req = 8 if args.quick else 60
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        export = _prepare(root)
        ps_port, serve_port = free_port(), free_port()
        (root / "infer.yml").write_text(
            f"common_config:\n  job_type: Infer\n  infer_config:\n    servers: [127.0.0.1:{ps_port}]\n"
            f"    embedding_checkpoint: {export / 'embedding'}\n"
        )
        env = {
            "PERSIA_REDIS_URL": "redis://127.0.0.1:1/0",
            "PERSIA_JOB_ID": "serve-bench",
            "LOG_LEVEL": "WARNING",
        }
        ps = ServiceProc.start(
            "pyrsia.services.embedding_ps",
            ["--global-config", str(root / "infer.yml"), "--port", str(ps_port)],
            env,
            role="ps",
            address=f"127.0.0.1:{ps_port}",
            timeout_s=120,
        )
        serve = ServiceProc.start(
            "persia.launcher",
            [
                "serve",
                "--model",
                str(export),
                "--global-config",
                str(root / "infer.yml"),
                "--port",
                str(serve_port),
            ],
            env,
            role="serve",
            address=f"127.0.0.1:{serve_port}",
            timeout_s=120,
        )
        try:
            worker = serve.health()[1]["embedding_workers"][0].removeprefix("http://")
            model = load_model(export)
            ctx = InferCtx([worker])
            ctx.wait_for_serving()
            for size in (1, 64, 1024):
                batches = [_batch(size, rng) for _ in range(n_req)]
                rows += measure_size(ctx, model, serve.url, batches, size)
            ctx.close()
        finally:
            serve.stop()
            ps.stop()
    report(rows, args.quick)


if __name__ == "__main__":
    main()
