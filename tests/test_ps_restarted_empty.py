"""A PS replica restarted empty under a running embedding worker stops the job, naming it.

A supervisor (docker ``restart: on-failure``, a pod restart) may start a killed PS replica
again on the same replica index. It comes back empty; the rows it held are lost. The worker
must refuse to go on with re-initialized rows: its next lookup or update touching that
replica answers 409 naming the replica and saying to resume from the last checkpoint, until
a checkpoint is loaded (``/load``) through it. A replica that held nothing yet (no training
lookup or update) may come back empty: it is configured again and the job goes on.
Real redis-server, real PS and worker processes over loopback.
"""

import numpy as np
import pytest

from pyrsia.services.embedding_worker.ps_boots import PSRestartedEmptyError, ReplicaBoots
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.http_client import HttpClient, RemoteConflictError
from tests.test_embedding_worker_service import (  # noqa: F401 (fixtures)
    configs,
    make_batch,
    setup_training,
    start_cluster,
)


@pytest.fixture
async def client():
    c = HttpClient(retries=0)
    yield c
    await c.close()


def restart_ps(services, flags, index: int, size: int):
    """Start a new PS process on replica ``index`` (as a supervisor would), unconfigured."""
    return services(
        "pyrsia.services.embedding_ps",
        [*flags, "--port", "0", "--replica-index", str(index), "--replica-size", str(size)],
        role=ROLE_EMBEDDING_PS,
        replica_index=index,
        wait_ready=False,
        timeout_s=60,
    )


async def train_step(client, url: str, batch_id: int):
    """One /batch + train /lookup + /gradients through the worker (the user slot's gradients)."""
    batch = make_batch(seed=batch_id)
    await client.call(
        f"{url}/batch",
        {"loader": 0, "batch_id": batch_id, "batch": batch.id_part().to_wire()},
        timeout_s=60,
    )
    out = await client.call(f"{url}/lookup", {"batch_id": batch_id, "train": True}, timeout_s=60)
    user = next(e["data"] for e in out["embeddings"] if e["name"] == "user")
    grads = [{"name": "user", "data": np.full_like(user, 0.01)}]
    return await client.call(
        f"{url}/gradients", {"batch_id": batch_id, "gradients": grads}, timeout_s=60
    )


async def test_ps_restarted_empty_mid_training_is_refused_naming_it(
    services,
    configs,  # noqa: F811 (the fixture imported above)
    client,
    tmp_path,
):
    flags = configs()
    (ps0, ps1), (w, w1) = start_cluster(services, flags, n_ps=2, n_workers=2)
    await setup_training(client, w.url)
    await train_step(client, w.url, 0)  # both replicas now hold trained rows
    await train_step(client, w1.url, 100)  # through the second worker too
    ckpt = tmp_path / "ckpt"
    await client.call(f"{w.url}/dump", {"dir": str(ckpt)}, timeout_s=60)
    ps1.kill()
    restart_ps(services, flags, 1, 2)
    for url, batch_id in ((w.url, 1), (w.url, 2), (w1.url, 101)):  # every time, every worker
        with pytest.raises(RemoteConflictError) as err:
            await train_step(client, url, batch_id)
        message = str(err.value)
        assert "PS replica 1" in message and "restarted empty" in message, message
        assert "resume" in message and "checkpoint" in message, message
    with pytest.raises(RemoteConflictError, match="PS replica 1"):  # no dump of the hole
        await client.call(f"{w.url}/dump", {"dir": str(tmp_path / "bad")}, timeout_s=60)
    # a resume loads the checkpoint into every replica through worker 0: training goes on,
    # through the worker that did not forward the /load too
    await client.call(f"{w.url}/load", {"dir": str(ckpt)}, timeout_s=60)
    await train_step(client, w.url, 3)
    await train_step(client, w1.url, 103)
    assert w.health()[0] == 200 and w1.health()[0] == 200


def test_replica_boot_rule():
    """The rule of ``ps_boots.py`` on its own: which boot id changes mark a replica lost."""
    boots = ReplicaBoots()
    url = "http://127.0.0.1:1"

    def seen(boot, path="/stats", loaded=False, index=0):
        return boots.observe(index, {"boot_id": boot, "loaded": loaded}, path, url)

    assert not seen("a", "/configure")
    assert not seen("b")  # held nothing yet: the new process is fine
    boots.hold(0)
    assert not seen("b")  # the same process (a Redis restart)
    assert seen("c", "/configure")  # restarted after it trained: lost
    with pytest.raises(PSRestartedEmptyError, match="PS replica 0 restarted empty"):
        boots.check(0, "/update")
    boots.check(0, "/configure")  # setup and /load still go through (a resume needs them)
    assert not seen("c", "/load", loaded=True)  # a resume: the loaded process is known
    boots.check(0, "/lookup")
    assert seen("d")  # it held the checkpoint: lost again
    assert not seen("d", loaded=True)  # loaded through another worker: known again
    boots.check(0, "/dump")
    assert not seen("d", "/clear", loaded=True)  # every replica emptied: nothing is held
    assert not seen("e") and 0 not in boots.lost
    assert not boots.observe(1, {"entries": 0}, "/stats", url)  # an Infer PS sends no boot id
