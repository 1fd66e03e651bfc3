import asyncio

import pytest

from pyrsia.shared.errors import RegistryError
from pyrsia.shared.registry import Registry, RegistrySettings, ServiceRecord
from tests.redis_server import RedisServer


def rec(role, i, n=2, port=1000):
    return ServiceRecord(
        role=role, replica_index=i, replica_size=n, address=f"127.0.0.1:{port + i}"
    )


async def test_register_discover_deregister(registry_settings):
    a, b, watcher = (Registry(registry_settings) for _ in range(3))
    await a.register(rec("ps", 0))
    await b.register(rec("ps", 1))
    found = await watcher.wait_for("ps", timeout_s=5)
    assert [r.address for r in found] == ["127.0.0.1:1000", "127.0.0.1:1001"]
    await b.close()
    assert set(await watcher.discover("ps")) == {0}
    await a.close()
    await watcher.close()


async def test_wait_for_names_missing_replicas(registry_settings):
    a, watcher = Registry(registry_settings), Registry(registry_settings)
    await a.register(rec("ps", 0, n=3))
    with pytest.raises(RegistryError, match=r"missing replica\(s\) \[1, 2\] of 3"):
        await watcher.wait_for("ps", timeout_s=0.3)
    with pytest.raises(RegistryError, match="no replica registered"):
        await watcher.wait_for("worker", timeout_s=0.2)
    await a.close()
    await watcher.close()


async def test_killed_replica_expires_by_ttl(registry_settings):
    dying = Registry(registry_settings, ttl_s=0.5, heartbeat_s=0.1)
    watcher = Registry(registry_settings)
    await dying.register(rec("ps", 0, n=1))
    assert 0 in await watcher.discover("ps")
    for task in dying._heartbeats:  # a crash: heartbeats stop, nothing is deleted
        task.cancel()
    await asyncio.sleep(0.8)
    assert await watcher.discover("ps") == {}
    await watcher.close()
    await dying._redis.aclose()


async def test_reregisters_after_redis_restart_and_keeps_addresses_during_outage():
    server = RedisServer().start()
    try:
        settings = RegistrySettings(redis_url=server.url, job_id="restart")
        svc = Registry(settings, ttl_s=2, heartbeat_s=0.1)
        watcher = Registry(settings)
        await svc.register(rec("ps", 0, n=1))
        assert 0 in await watcher.discover("ps")
        server.stop()
        during = await watcher.discover("ps")  # outage: last known addresses
        assert during[0].address == "127.0.0.1:1000"
        server.start()  # restarted empty
        for _ in range(50):
            if await watcher.discover("ps"):
                break
            await asyncio.sleep(0.1)
        assert 0 in await watcher.discover("ps")
        await svc.close()
        await watcher.close()
    finally:
        server.stop()


async def test_unreachable_redis_names_the_url():
    reg = Registry(RegistrySettings(redis_url="redis://127.0.0.1:1/0", job_id="x"))
    with pytest.raises(RegistryError, match="redis://127.0.0.1:1/0"):
        await reg.ping()
    await reg.close()


async def test_every_redis_failure_is_a_registry_error():
    """register, publish and read of the master address: RedisError never leaks."""
    reg = Registry(RegistrySettings(redis_url="redis://127.0.0.1:1/0", job_id="x"))
    with pytest.raises(RegistryError, match="redis://127.0.0.1:1/0"):
        await reg.register(rec("ps", 0, n=1))
    with pytest.raises(RegistryError, match="master address"):
        await reg.publish_master_addr("127.0.0.1:29500")
    with pytest.raises(RegistryError):
        await reg.get_master_addr()
    await reg.close()


def test_malformed_redis_url_is_a_config_error_naming_the_variable():
    from pyrsia.shared.errors import ConfigError

    with pytest.raises(ConfigError, match="PERSIA_REDIS_URL"):
        Registry(RegistrySettings(redis_url="http://nowhere", job_id="x"))
