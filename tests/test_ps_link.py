"""The embedding worker's link to its PS (pyrsia/services/embedding_worker/ps_link.py).

Both implementations of :class:`PSLink`, the HTTP ``PSClient`` (services mode) and the
in-process ``LocalPS`` (embedded mode), have every member of the protocol with its
signature, and answer alike: the same calls, one against a real PS service on loopback (real
Redis), the other against the PS engine in this process, built from the same YAML file.
"""

from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pyrsia.services.embedded.local_ps import LocalPS
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_worker.ps_client import PSClient
from pyrsia.services.embedding_worker.ps_link import PSLink
from pyrsia.shared.config import load_global_config
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.embedding_spec import EmbeddingHyperparams, optimizer_from_dict
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.registry import Registry
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.admin import Configure, Directory, RegisterOptimizer
from tests.test_embedded_client import ADAGRAD, HYPER
from tests.test_embedding_worker_service import configs

__all__ = ["configs"]  # the fixture, re-used

MANIFEST_SAME = ("format", "entries", "replica_index", "replica_count", "optimizer")
"""What a checkpoint's manifest says alike wherever the same store was dumped (not its times,
token and file names), with each dim's entries."""
BOOT_KEYS = {"boot_id", "loaded"}
"""What a PS service adds to its answers (which process answered); a process has none."""


def protocol_gaps(cls: type, protocol: type = PSLink) -> list[str]:
    """Each member of ``protocol`` that ``cls`` lacks or declares otherwise (a method's
    parameters, defaults, annotations and return, async or not; a property a property).
    Data attributes are set in ``__init__``: they are checked on instances."""
    gaps = []
    for name, want in vars(protocol).items():
        if name.startswith("_"):
            continue
        have = getattr(cls, name, None)
        if isinstance(want, property):
            if not isinstance(have, property):
                gaps.append(f"{cls.__name__}.{name}: not a property")
        elif callable(want):
            if not callable(have):
                gaps.append(f"{cls.__name__}.{name}: missing")
            elif inspect.iscoroutinefunction(want) != inspect.iscoroutinefunction(have):
                gaps.append(f"{cls.__name__}.{name}: async differs")
            elif inspect.signature(want) != inspect.signature(have):
                gaps.append(
                    f"{cls.__name__}.{name}{inspect.signature(have)} != {inspect.signature(want)}"
                )
    return gaps


def test_both_ps_links_have_every_member_of_the_protocol_with_its_signature():
    assert protocol_gaps(PSClient) == []
    assert protocol_gaps(LocalPS) == []


def test_the_protocol_check_names_what_differs():
    class Partial:
        replica_count = 1  # not a property

        async def lookup(self, per_replica, train):  # train not keyword-only, no annotations
            return []

        def update(self, per_replica: list[list[tuple[int, Any, Any]]]) -> Any:  # not async
            return None

    gaps = protocol_gaps(Partial)
    assert "Partial.replica_count: not a property" in gaps
    assert "Partial.update: async differs" in gaps
    assert "Partial.configure: missing" in gaps and "Partial.stats: missing" in gaps
    assert any(g.startswith("Partial.lookup(self, per_replica, train) !=") for g in gaps), gaps


def _without_boot(answers: list[Any]) -> list[Any]:
    return [{k: v for k, v in a.items() if k not in BOOT_KEYS} for a in answers]


async def _every_call(link: PSLink, directory: str) -> dict[str, Any]:
    """Every call of the link, in a fixed order: what each answered."""
    ids = np.array([3, 7, 11, 7 << 40], np.uint64)
    out: dict[str, Any] = {"replicas": link.replica_count}
    out["configure"] = _without_boot(await link.configure(Configure(HYPER_PARAMS)))
    out["optimizer"] = _without_boot(await link.register_optimizer(RegisterOptimizer(OPTIMIZER)))
    (before,) = await link.lookup([[(4, ids), (8, ids[:2] + 100)]], train=True)
    out["before"], out["before_8"] = (np.array(a) for a in before)
    grads = np.linspace(-1, 1, ids.size * 4, dtype=np.float32).reshape(ids.size, 4)
    totals, dropped = await link.update(
        [[(4, ids, grads), (8, ids[:0], np.empty((0, 8), np.float32))]]
    )
    out["totals"], out["dropped"] = totals, dropped
    out["applied"] = link.applied_updates
    (after,) = await link.lookup([[(4, ids)]], train=False)
    out["after"] = np.array(after[0])
    (stats,) = await link.stats()
    out["entries"], out["updates"] = stats.entries, stats.updates_applied
    manifests = [a["manifest"] for a in await link.dump(Directory(directory))]
    out["dumped"] = [
        (sorted(m), [m[k] for k in MANIFEST_SAME], {d: v["entries"] for d, v in m["dims"].items()})
        for m in manifests
    ]
    out["cleared"] = [a["entries"] for a in await link.clear()]
    out["loaded"] = _without_boot(await link.load(Directory(directory)))
    (reloaded,) = await link.lookup([[(4, ids)]], train=False)
    out["reloaded"] = np.array(reloaded[0])
    out["dropped_updates"] = link.dropped_updates
    return out


HYPER_PARAMS = EmbeddingHyperparams.from_dict(HYPER, field="hyperparams")
OPTIMIZER = optimizer_from_dict(ADAGRAD, field="optimizer")


async def test_local_ps_and_the_http_client_answer_alike(
    services, configs, registry_settings, tmp_path
):
    flags = configs()
    args = [*flags, "--port", "0", "--replica-index", "0", "--replica-size", "1"]
    services("pyrsia.services.embedding_ps", args, role=ROLE_EMBEDDING_PS, wait_ready=False)
    http, registry = HttpClient(retries=0), Registry(registry_settings)
    try:
        client = PSClient(registry, http)
        await client.connect(timeout_s=30)
        want = await _every_call(client, str(tmp_path / "http"))
    finally:
        await http.close()
        await registry.close()
    ps_config = load_global_config(flags[3]).embedding_parameter_server_config
    store = EmbeddingStore(ps_config.capacity, ps_config.num_hashmap_internal_shards)
    offload = Offloader(ThreadPoolExecutor(max_workers=1))
    try:
        got = await _every_call(LocalPS(store, offload), str(tmp_path / "local"))
    finally:
        offload.shutdown()
        store.close()
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
        else:
            assert got[key] == value, key
    assert want["totals"].applied == 4 and want["cleared"] == [0] and want["entries"] == 6
    assert not np.allclose(want["after"], want["before"])  # the update moved them
    np.testing.assert_array_equal(got["reloaded"], got["after"])
