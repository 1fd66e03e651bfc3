"""Hypothesis fuzzing of ``persia-launcher serve`` (``/predict``) against a real serving stack.

The stack (tests/faults/serve_stack.py) is an Infer PS holding the exported model's
embeddings and ``persia-launcher serve`` with its private embedding worker. ``/predict``
takes msgpack, JSON or PERSIA batch bytes, so it gets hostile bodies of each form, drawn
by the same strategies as the services' routes (tests/faults/fuzz_bodies.py):
``PYRSIA_FUZZ_EXAMPLES`` (default 150) msgpack bodies mutated from a valid one, as many
JSON bodies (mutations of a valid JSON body, and random text), and damaged
``{"batch": PersiaBatch.to_bytes()}`` bodies. After every request: no 5xx but 503, serve
and the PS alive and healthy, and the served state unchanged (PS checksum and the exact
predictions of a probe batch). Then: a body over ``--max-request-bytes`` is a 413, bodies
cut short on the socket do no harm, random methods and paths, and the export directory's
files are byte for byte the same at the end. Counts go to ``bench_results/fuzz_predict.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyrsia.shared.codec import packb
from tests.faults.fuzz_bodies import damaged_bytes, hostile_body, mutated
from tests.faults.raw_http import truncated_post
from tests.faults.serve_stack import ServeStack, artifact_digest
from tests.faults.test_fuzz_routes import FUZZ
from tests.nn_helpers import make_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
JSON = "application/json"


def _jsonable(value):
    """JSON form of a (mutated) body: arrays as nested lists, bytes as text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 100_000 else []
    if isinstance(value, (bytes, bytearray)):
        return value.decode("latin-1")
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "data") and hasattr(value, "code"):  # a forged msgpack extension
        return {"ext": value.code}
    return value


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = ServeStack(tmp_path_factory.mktemp("fuzz-predict")).start()
    yield s
    artifact_same = artifact_digest(s.export) == s.artifact
    codes = s.stop()
    tally = {key: dict(sorted(counts.items())) for key, counts in sorted(s.tally.items())}
    total = sum(sum(v.values()) for v in tally.values())
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "fuzz_predict.json").write_text(
        json.dumps({"requests": total, "by_route": tally}, indent=1)
    )
    print(f"\nfuzz /predict: {total} hostile requests")
    for key, counts in tally.items():
        print(f"  {key:40s} {counts}")
    assert all(code == 0 for code in codes.values()), codes
    assert artifact_same, "the export directory changed while it was served"


def test_the_templates_are_valid(stack):
    """Mutations start from bodies /predict accepts, so they reach past the first check."""
    assert stack.send(packb(stack.probe)) == 200
    as_json = json.dumps(_jsonable(stack.probe)).encode()
    assert stack.send(as_json, content_type=JSON) == 200
    batch = make_batch(list(range(1, 9)), requires_grad=False, seed=3)
    assert stack.send(packb({"batch": batch.to_bytes()})) == 200


def test_hostile_msgpack_bodies(stack):
    @FUZZ
    @given(data=st.data())
    def one(data):
        _family, raw = data.draw(hostile_body(stack.probe))
        stack.send(raw)

    one()


def test_hostile_json_bodies(stack):
    @FUZZ
    @given(data=st.data())
    def one(data):
        if data.draw(st.booleans()):
            body = _jsonable(data.draw(mutated(stack.probe)))
            raw = json.dumps(body, allow_nan=True).encode()
        else:
            raw = data.draw(st.text(max_size=64)).encode("utf-8", "surrogatepass")
        stack.send(raw, content_type=JSON)

    one()


def test_damaged_persia_batch_bytes(stack):
    valid = make_batch(list(range(1, 9)), requires_grad=False, seed=3).to_bytes()

    @FUZZ
    @given(data=st.data())
    def one(data):
        stack.send(packb({"batch": data.draw(damaged_bytes(valid))}))

    one()


def test_over_the_cap_is_413_and_truncated_bodies_do_no_harm(stack):
    big = np.zeros(stack.cap_bytes // 8 + 16, np.uint64)
    assert stack.send(packb({**stack.probe, "x": big})) == 413
    assert stack.send(b"[" + b"0," * (stack.cap_bytes // 2) + b"0]", content_type=JSON) == 413
    valid = packb(stack.probe)
    url = stack.procs["serve"].url
    for cut in (0, 1, len(valid) // 2, len(valid) - 1):
        truncated_post(url, "/predict", valid[:cut], announced=len(valid))
        truncated_post(url, "/predict", valid[:cut], announced=1 << 40)
    stack.send(None, method="GET", path="/health")  # and the invariants hold after it


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
    path=st.one_of(
        st.sampled_from(["/predict", "/signature", "/health", "/metrics", "/", "/../etc/passwd"]),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=30).map(
            lambda s: "/" + s.replace("?", "").replace("#", "")
        ),
    ),
    body=st.one_of(st.none(), st.binary(max_size=32)),
)
def test_random_methods_and_paths(stack, method, path, body):
    stack.send(body, method=method, path=path)
