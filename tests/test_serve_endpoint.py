"""persia-launcher serve end to end: train (real PS + worker + Redis), export, serve without Redis.

Training stack: 2 PS replicas writing incremental packets, 1 embedding worker, Redis.
Serving stack: 2 PS replicas with ``job_type: Infer`` at ``infer_config.servers`` (loading the
export's embedding checkpoint and scanning the incremental dir every second), and
``persia-launcher serve`` with its private embedding worker; ``PERSIA_REDIS_URL`` points at a
closed port for the whole serving stack, so nothing there can use Redis.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest

from persia.serving import load_model
from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.wire.serve import PredictAnswer
from tests.nn_helpers import EMBEDDING_CONFIG, environ
from tests.redis_server import free_port
from tests.service_procs import ServiceProc
from tests.serving_stack import (
    IDS,
    SCAN_INTERVAL_S,
    predictions,
    start_serving_stack,
    train,
    train_and_export,
)


@pytest.fixture(scope="module")
def stack(redis_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    (root / "embedding_config.yml").write_text(EMBEDDING_CONFIG)
    inc = root / "inc"
    (root / "train.yml").write_text(
        "embedding_parameter_server_config:\n  enable_incremental_update: true\n"
        f"  incremental_buffer_size: 1\n  incremental_dir: {inc}\n"
    )
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"serve-{uuid.uuid4().hex[:8]}"}
    procs: list[ServiceProc] = []

    def start(module, args, env, **kw):
        procs.append(ServiceProc.start(module, args, env, log_dir=root, **kw))
        return procs[-1]

    try:
        with environ(
            **env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None, EMBEDDING_WORKER_SERVICE=None
        ):
            model, probe, want, export = train_and_export(root, start, env)
            infer_ps, serve = start_serving_stack(root, start, env, export, inc)
            yield {
                "root": root,
                "model": model,
                "probe": probe,
                "want": want,
                "export": export,
                "serve": serve,
                "infer_ps": infer_ps,
                "inc": inc,
            }
    finally:
        codes = {f"{p.role}/{p.replica_index}": p.stop() for p in reversed(procs)}
        assert all(c == 0 for c in codes.values()), codes
        serve_logs = [p.log_text() for p in procs if p.role == "serve"]
        assert all("private embedding worker exited with code 0" in t for t in serve_logs)


def _post(url: str, body, *, as_json: bool = False) -> tuple[int, dict]:
    data = json.dumps(body).encode() if as_json else packb(body)
    kind = "application/json" if as_json else "application/msgpack"
    req = urllib.request.Request(url, data=data, headers={"Content-Type": kind}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        with exc:
            raw, status = exc.read(), exc.code
    return status, (json.loads(raw) if as_json else unpackb(raw))


def _request(batch, *, as_json: bool):
    a, r = batch.id_type_features
    dense = np.asarray(batch.non_id_type_features[0].data)
    if as_json:
        per_sample = [
            r.ids[r.offsets[i] : r.offsets[i + 1]].tolist() for i in range(batch.batch_size)
        ]
        return {
            "non_id": {"non_id_0": dense.tolist()},
            "ids": {"a": a.ids.tolist(), "r": per_sample},
        }
    return {
        "non_id": {"non_id_0": dense},
        "ids": {"a": a.ids, "r": {"ids": r.ids, "offsets": r.offsets}},
    }


def test_served_predictions_equal_the_training_jobs_eval_predictions(stack):
    url = f"{stack['serve'].url}/predict"
    status, answer = _post(url, _request(stack["probe"], as_json=False))
    assert status == 200, answer
    decoded = PredictAnswer.from_wire(answer)  # the client's one check of the answer
    assert decoded.batch_size == len(IDS) and decoded.outputs[0][0] == "output_0"
    np.testing.assert_array_equal(decoded.outputs[0][1], stack["want"])
    status, answer = _post(url, _request(stack["probe"], as_json=True), as_json=True)
    assert status == 200, answer
    np.testing.assert_array_equal(
        np.asarray(answer["outputs"]["output_0"], np.float32), stack["want"]
    )
    # PERSIA's TorchServe client sends PersiaBatch.to_bytes()
    status, answer = _post(url, {"batch": stack["probe"].to_bytes()})
    assert status == 200, answer
    np.testing.assert_array_equal(answer["outputs"]["output_0"], stack["want"])


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda b: b["non_id"].pop("non_id_0"), "non_id.non_id_0"),
        (lambda b: b["non_id"].update(non_id_0=[[1.0, 2.0, 3.0]] * len(IDS)), "non_id.non_id_0"),
        (lambda b: b["non_id"].update(extra=[1.0]), "non_id"),
        (lambda b: b["ids"].pop("r"), "ids.r"),
        (lambda b: b["ids"].update(a=[-1] * len(IDS)), "ids.a"),
        (lambda b: b["ids"].update(a=list(range(len(IDS) - 1))), "ids.a"),
        (lambda b: b["ids"].update(r={"ids": [1, 2], "offsets": [0, 3]}), "ids.r.offsets"),
        (lambda b: b["ids"].update(a="seven"), "ids.a"),
        (lambda b: b.update(junk=1), "body"),
        (
            lambda b: b["non_id"].update(non_id_0=[[float("nan"), 1.0]] * len(IDS)),
            "non_id.non_id_0",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(stack, edit, field):
    body = _request(stack["probe"], as_json=True)
    edit(body)
    data = json.dumps(body, allow_nan=True)
    req = urllib.request.Request(
        f"{stack['serve'].url}/predict",
        data=data.encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    with err.value:
        assert err.value.code == 400
        answer = json.loads(err.value.read())
    assert answer["field"] == field, answer
    assert answer["message"] and answer["expected"]
    status, _ = _post(f"{stack['serve'].url}/predict", _request(stack["probe"], as_json=False))
    assert status == 200  # the endpoint keeps serving


def test_bad_msgpack_body_is_a_400(stack):
    req = urllib.request.Request(
        f"{stack['serve'].url}/predict",
        data=b"\xc1\x00garbage",
        headers={"Content-Type": "application/msgpack"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    with err.value:
        assert err.value.code == 400
        assert unpackb(err.value.read())["error"]


def test_health_signature_and_metrics(stack):
    status, health = stack["serve"].health()
    assert status == 200 and health["ready"] and len(health["embedding_workers"]) == 1
    with urllib.request.urlopen(f"{stack['serve'].url}/signature", timeout=10) as resp:
        assert json.loads(resp.read())["id_slots"] == ["a", "r"]
    with urllib.request.urlopen(f"{stack['serve'].url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'pyrsia_serve_requests_total{outcome="200"}' in text
    assert 'pyrsia_serve_seconds_count{stage="lookup"}' in text
    for ps in stack["infer_ps"]:
        with urllib.request.urlopen(f"{ps.url}/metrics", timeout=10) as resp:
            assert "pyrsia_ps_incremental_packets_applied" in resp.read().decode()


def test_served_predictions_follow_incremental_updates(stack):
    """Train more: the Infer PS applies the packets, the served prediction moves with them."""
    url, probe = f"{stack['serve'].url}/predict", stack["probe"]
    before = _post(url, _request(probe, as_json=False))[1]["outputs"]["output_0"]
    writer_dir = stack["inc"] / "replica_0"
    seqs = [int(p.name.split("_")[1]) for p in writer_dir.glob("packet_*")]
    torn = writer_dir / f"packet_{max(seqs) + 1:08d}_{int(time.time() * 1000) - 1}"
    torn.mkdir()
    (torn / "manifest.json").write_text("{}")  # a writer that died mid-packet: no done marker
    updated = IDS[:16]
    train(stack["model"], 3, updated, seed=10)  # leaving TrainCtx waits for every gradient
    trained_at = time.monotonic()
    _, non_id, emb = predictions(stack["model"], probe)
    expected = load_model(stack["export"]).predict(non_id, emb)[0].numpy()
    assert not np.array_equal(expected, before)
    deadline = trained_at + SCAN_INTERVAL_S + 20  # scan interval, plus slack for a loaded machine
    got = before
    while time.monotonic() < deadline:
        got = _post(url, _request(probe, as_json=False))[1]["outputs"]["output_0"]
        if np.array_equal(got, expected):
            break
        time.sleep(0.1)
    latency = time.monotonic() - trained_at
    np.testing.assert_array_equal(got, expected)
    changed = ~np.isclose(got, before).reshape(-1)
    # samples whose ids were trained (slot r holds id k and k + 1) moved; the others did not
    assert changed[: len(updated) + 1].all() and not changed[len(updated) + 1 :].any()
    print(
        f"served prediction moved {latency:.2f}s after training (scan interval {SCAN_INTERVAL_S}s)"
    )
    logs = stack["infer_ps"][0].log_text() + stack["infer_ps"][1].log_text()
    assert f"{torn.name} has no done marker" in logs and "skipped as torn" in logs


def test_serve_with_named_embedding_workers(stack):
    """--embedding-worker: use running workers instead of starting one (InferCtx-style)."""
    _, health = stack["serve"].health()
    port = free_port()
    other = ServiceProc.start(
        "persia.launcher",
        [
            "serve",
            "--model",
            str(stack["export"]),
            "--port",
            str(port),
            "--embedding-worker",
            health["embedding_workers"][0].removeprefix("http://"),
        ],
        {**stack["serve"].env},
        role="serve",
        replica_index=1,
        address=f"127.0.0.1:{port}",
        log_dir=stack["root"],
    )
    try:
        status, answer = _post(f"{other.url}/predict", _request(stack["probe"], as_json=False))
        assert status == 200
        served = _post(f"{stack['serve'].url}/predict", _request(stack["probe"], as_json=False))[1]
        np.testing.assert_array_equal(answer["outputs"]["output_0"], served["outputs"]["output_0"])
    finally:
        assert other.stop() == 0


def test_serve_refuses_workers_with_another_embedding_config(stack):
    """A worker started with other slots/dims would answer garbage: serve stays unready, says why."""
    root = stack["root"]
    other_cfg = root / "other_embedding_config.yml"
    other_cfg.write_text(EMBEDDING_CONFIG.replace("dim: 4", "dim: 5"))
    env = {**stack["serve"].env}
    worker_port, port = free_port(), free_port()
    worker = ServiceProc.start(
        "pyrsia.services.embedding_worker",
        [
            "--embedding-config",
            str(other_cfg),
            "--global-config",
            str(root / "infer.yml"),
            "--port",
            str(worker_port),
        ],
        env,
        role="other_worker",
        address=f"127.0.0.1:{worker_port}",
        log_dir=root,
    )
    serve = ServiceProc.start(
        "persia.launcher",
        [
            "serve",
            "--model",
            str(stack["export"]),
            "--port",
            str(port),
            "--embedding-worker",
            f"127.0.0.1:{worker_port}",
        ],
        env,
        role="serve",
        replica_index=2,
        address=f"127.0.0.1:{port}",
        wait_ready=False,
        log_dir=root,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, health = serve.health()
            if "another embedding config" in health.get("reason", ""):
                break
            time.sleep(0.1)
        assert status == 503 and "another embedding config" in health["reason"], health
        status, answer = _post(f"{serve.url}/predict", _request(stack["probe"], as_json=False))
        assert status == 503 and "another embedding config" in answer["message"]
    finally:
        assert serve.stop() == 0
        assert worker.stop() == 0
