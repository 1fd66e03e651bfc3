"""``persia-launcher serve`` with ``PERSIA_AUTH_TOKEN`` on a non-loopback bind: every route
(``/health`` and ``/metrics`` included, as on the services) answers 401 without the token or
with a wrong one, and predicts with it; refused requests change nothing served."""

from __future__ import annotations

import secrets

import pytest

from pyrsia.shared.codec import packb
from tests.faults.raw_http import RawClient
from tests.faults.serve_stack import ServeStack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = ServeStack(
        tmp_path_factory.mktemp("serve-auth"), host="0.0.0.0", token=secrets.token_hex(16)
    ).start()
    yield s
    codes = s.stop()
    assert all(code == 0 for code in codes.values()), codes


@pytest.mark.parametrize("header", [None, "Bearer wrong-token-of-enough-length", "Basic x"])
@pytest.mark.parametrize(
    "method, path",
    [("POST", "/predict"), ("GET", "/signature"), ("GET", "/health"), ("GET", "/metrics")],
)
def test_without_the_token_is_401(stack, header, method, path):
    client = RawClient(stack.procs["serve"].url)
    try:
        headers = {"Authorization": header} if header else {}
        body = packb(stack.probe) if method == "POST" else None
        status, _ = client.request(method, path, body, headers)
    finally:
        client.close()
    assert status == 401
    assert stack.state() == stack.before


def test_with_the_token_it_predicts(stack):
    status, answer = stack.predict(stack.probe)
    assert status == 200 and answer["batch_size"] == 32
    assert stack.send(None, method="GET", path="/signature") == 200
