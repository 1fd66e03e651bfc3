"""Fixtures of the cluster-in-a-box tests: a :class:`Network` of simulated hosts per test."""

from __future__ import annotations

import pytest

from tests.cluster.netns import Network, unavailable_reason


@pytest.fixture(scope="session")
def netns_reason() -> str | None:
    return unavailable_reason()


@pytest.fixture
def network(netns_reason):
    """Factory: ``network(hosts)`` makes the hosts; every namespace, link, hosts file and
    process in them is removed when the test ends, failed or not. Skips (with the reason)
    where this machine cannot make network namespaces."""
    if netns_reason is not None:
        pytest.skip(f"cluster in a box needs network namespaces: {netns_reason}")
    made: list[Network] = []

    def make(hosts: list[str], **kwargs) -> Network:
        net = Network(hosts, **kwargs)
        made.append(net)
        try:
            return net.create()
        except BaseException:
            net.close()
            raise

    make.loopback = lambda hosts: make(hosts, loopback_hostname=True)
    yield make
    for net in made:
        net.close()
