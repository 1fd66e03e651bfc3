"""Hypothesis fuzzing of every HTTP route of the PS, the embedding worker and the NN-worker
ingress, against real servers over loopback (tests/faults/cluster.py has the invariants).

Each route gets ``PYRSIA_FUZZ_EXAMPLES`` (default 150) hostile bodies drawn by
:func:`tests.faults.fuzz_bodies.hostile_body` from a valid body of that route: random
bytes, random msgpack, mutated valid bodies (wrong dtypes and shapes, huge declared
sizes, forged array headers, missing and extra fields) and truncated or damaged
encodings. After every request: no 5xx but 503, every process alive and healthy, and
a refused request changed nothing (PS checksum, worker buffers). Then bodies over the
size cap (413), bodies cut short on the socket, and random methods and paths.
The per-route status counts are printed and written to ``bench_results/fuzz.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.cluster import HYPER, OPTIMIZER, Cluster
from tests.faults.fuzz_bodies import hostile_body
from tests.faults.raw_http import truncated_post
from tests.nn_helpers import make_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

EXAMPLES = int(os.environ.get("PYRSIA_FUZZ_EXAMPLES", "150"))
REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(
    max_examples=EXAMPLES,
    # A fixed seed in CI (hypothesis's advice for CI): a run is reproducible and a red run
    # is a server bug, not a draw. PYRSIA_FUZZ_RANDOM=1 explores new bodies each run.
    derandomize=os.environ.get("PYRSIA_FUZZ_RANDOM") != "1",
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def cluster(redis_server, tmp_path_factory):
    c = Cluster(redis_server.url, tmp_path_factory.mktemp("fuzz")).start()
    yield c
    codes = c.stop()
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    tally = {route: dict(sorted(counts.items())) for route, counts in sorted(c.tally.items())}
    total = sum(sum(v.values()) for v in tally.values())
    (out / "fuzz.json").write_text(json.dumps({"requests": total, "by_route": tally}, indent=1))
    print(f"\nfuzz: {total} hostile requests")
    for route, counts in tally.items():
        print(f"  {route:28s} {counts}")
    assert all(code == 0 for code in codes.values()), codes


def _ids(c: Cluster) -> np.ndarray:
    return np.arange(1, 9, dtype=np.uint64) * 1000


def _grads(c: Cluster) -> np.ndarray:
    return np.full((8, 4), 0.01, np.float32)


def _gradients_template(c: Cluster) -> dict:
    batch_id, grads = c.awaiting_batch()
    return {"batch_id": batch_id, "loss_scale": 1.0, "gradients": grads}


PS_TEMPLATES = {
    "/configure": lambda c: {"hyperparams": dict(HYPER)},
    "/register_optimizer": lambda c: {"optimizer": dict(OPTIMIZER)},
    "/lookup": lambda c: {"train": False, "groups": [{"dim": 4, "ids": _ids(c)}]},
    "/update": lambda c: {"groups": [{"dim": 4, "ids": _ids(c), "grads": _grads(c)}]},
    "/dump": lambda c: {"dir": str(c.sandbox / "ps")},
    "/load": lambda c: {"dir": str(c.sandbox / "ps")},
    "/clear": lambda c: {},
    "/stats": lambda c: {},
    "/checksum": lambda c: {},
}
EW_TEMPLATES = {
    "/batch": lambda c: {
        "loader": 0,
        "batch_id": next(c.ids),
        "batch": make_batch([next(c.ids), 3]).id_part().to_wire(),
    },
    "/lookup": lambda c: {"batch_id": c.buffered_batch(), "train": True},
    "/lookup_direct": lambda c: {
        "batch": make_batch([11, 12], requires_grad=False).id_part().to_wire(),
        "train": False,
    },
    "/gradients": _gradients_template,
    # the gathered forms (pyrsia/shared/wire/gathered.py): "#..." names a variant of the route
    "/lookup#gathered": lambda c: {"batch_id": c.buffered_batch(), "train": True, "gathered": True},
    "/lookup_direct#gathered": lambda c: {
        "batch": make_batch([11, 12], requires_grad=False).id_part().to_wire(),
        "train": False,
        "gathered": True,
    },
    "/gradients#gathered": lambda c: c.awaiting_gathered_batch(),
    "/stats": lambda c: {},
    "/configure": lambda c: {"hyperparams": dict(HYPER)},
    "/register_optimizer": lambda c: {"optimizer": dict(OPTIMIZER)},
    "/dump": lambda c: {"dir": str(c.sandbox / "ew")},
    "/load": lambda c: {"dir": str(c.sandbox / "ew")},
    "/clear": lambda c: {},
}
NN_TEMPLATES = {
    "/ingress": lambda c: {
        "loader": 0,
        "batch_id": next(c.ids),
        "worker": 0,
        "dense": make_batch([1, 2]).dense_part().to_wire(),
    },
    "/done": lambda c: {"loader": 0, "loader_count": 1, "sent": 0},
}
ROUTES = (
    [("ps", p) for p in PS_TEMPLATES]
    + [("ew", p) for p in EW_TEMPLATES]
    + [("nn", p) for p in NN_TEMPLATES]
)
TEMPLATES = {"ps": PS_TEMPLATES, "ew": EW_TEMPLATES, "nn": NN_TEMPLATES}


@pytest.mark.parametrize("service,path", ROUTES, ids=[f"{s}{p}" for s, p in ROUTES])
def test_the_fuzzed_templates_are_valid(cluster, service, path):
    """Mutations start from bodies the route accepts, so they reach past the first check."""
    if path == "/load":
        cluster.call(service, "/dump", TEMPLATES[service]["/dump"](cluster))
    answer = cluster.call(service, _route(path), TEMPLATES[service][path](cluster))
    if path.startswith("/lookup") and path.endswith("#gathered"):
        assert answer["tables"] and answer["embeddings"][0] == {"name": "a", "table": 0}


def _route(path: str) -> str:
    """The HTTP path of a route or of a variant of it (``/gradients#gathered``)."""
    return path.split("#")[0]


@pytest.mark.parametrize("service,path", ROUTES, ids=[f"{s}{p}" for s, p in ROUTES])
def test_hostile_bodies(cluster, service, path):
    template_of = TEMPLATES[service][path]

    @FUZZ
    @given(data=st.data())
    def one(data):
        _family, raw = data.draw(hostile_body(template_of(cluster)))
        cluster.send(service, _route(path), raw)

    one()


@pytest.mark.parametrize("service,path", ROUTES, ids=[f"{s}{p}" for s, p in ROUTES])
def test_over_the_cap_is_413_and_truncated_bodies_do_no_harm(cluster, service, path):
    big = np.zeros(cluster.cap_bytes // 8 + 16, np.uint64)
    body = {**TEMPLATES[service][path](cluster), "x": big}
    from pyrsia.shared.codec import packb

    assert cluster.send(service, _route(path), packb(body)) == 413
    valid = packb(TEMPLATES[service][path](cluster))
    url = cluster.procs[service].url
    for cut in (0, 1, len(valid) // 2, len(valid) - 1):
        truncated_post(url, _route(path), valid[:cut], announced=len(valid))
        truncated_post(url, _route(path), valid[:cut], announced=1 << 40)
    cluster.send(service, "/health", None, method="GET")  # and the invariants hold after it


@FUZZ
@given(
    service=st.sampled_from(["ps", "ew", "nn"]),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
    path=st.one_of(
        st.sampled_from(
            [_route(p) for _, p in ROUTES] + ["/health", "/metrics", "/", "/../etc/passwd"]
        ),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=30).map(
            lambda s: "/" + s.replace("?", "").replace("#", "")
        ),
    ),
    body=st.one_of(st.none(), st.binary(max_size=32)),
)
def test_random_methods_and_paths(cluster, service, method, path, body):
    if method == "POST" and path in ("/clear", "/load", "/dump", "/done"):
        method = "GET"  # the state-changing routes have their own fuzz above
    cluster.send(service, path, body, method=method)
