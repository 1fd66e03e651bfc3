"""The exception tree keeps local and remote errors apart (pyrsia/shared/errors.py).

A process raises NotFoundError / ConflictError / BackPressureError about its own state;
a peer's 404 / 409 / 429 comes back as a Remote* class that is both the local class and a
RemoteError. Checked through a real aiohttp server on loopback and the real client.
"""

from __future__ import annotations

import pytest
from aiohttp import web

from pyrsia.shared import errors
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.http_server import make_app, msgpack_handler
from pyrsia.shared.settings import Settings

LOCAL_AND_REMOTE = [
    (errors.NotFoundError, errors.RemoteNotFoundError, 404),
    (errors.ConflictError, errors.RemoteConflictError, 409),
    (errors.BackPressureError, errors.RemoteBackPressureError, 429),
]


@pytest.mark.parametrize(("local", "remote", "status"), LOCAL_AND_REMOTE)
def test_a_local_error_is_not_a_remote_error(local, remote, status):
    assert not issubclass(local, errors.RemoteError)
    assert issubclass(remote, local) and issubclass(remote, errors.RemoteError)
    assert local.status == remote.status == status


@pytest.fixture
async def refusing_server():
    """A server whose /refuse/<status> route raises the local error for that status."""
    by_status = {status: local for local, _, status in LOCAL_AND_REMOTE}

    async def refuse(request: web.Request, body: object) -> dict:
        raise by_status[int(request.match_info["status"])]("refused here")

    app = make_app("refuser", auth_token=None, settings=Settings.from_env({}))
    app.router.add_post("/refuse/{status}", msgpack_handler(refuse))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = HttpClient(auth_token=None)
    yield client, f"http://127.0.0.1:{port}"
    await client.close()
    await runner.cleanup()


@pytest.mark.parametrize(("local", "remote", "status"), LOCAL_AND_REMOTE)
async def test_a_peers_answer_comes_back_as_the_remote_class(
    refusing_server, local, remote, status
):
    client, url = refusing_server
    with pytest.raises(remote) as info:
        await client.call(f"{url}/refuse/{status}", {})
    assert type(info.value) is remote and info.value.peer_status == status
    assert isinstance(info.value, local) and "refused here" in str(info.value)


def test_library_errors_are_still_the_builtin_persia_users_catch():
    """PersiaBatch with a wrong type or an impossible request: Pyrsia's classes, caught as
    PERSIA's users catch them (TypeError, RuntimeError)."""
    import numpy as np

    from persia.embedding.data import IDTypeFeature, Label, PersiaBatch

    ids = IDTypeFeature("user", [np.array([1], dtype=np.uint64)])
    with pytest.raises(TypeError) as wrong_type:
        PersiaBatch([ids], labels=[Label(np.ones((1, 1), np.float32))], requires_grad="yes")
    assert isinstance(wrong_type.value, errors.InvalidTypeError)
    assert wrong_type.value.field == "requires_grad"
    with pytest.raises(RuntimeError) as misuse:
        PersiaBatch([ids], requires_grad=True)
    assert isinstance(misuse.value, errors.MisuseError)
    assert isinstance(misuse.value, errors.PersiaError)
