"""The topologies the lock's promises are tested on, as fixtures (``conftest.py`` imports
them): one server, a Redis Cluster of three primaries, and a quorum of three independent
servers. ``topology`` is parametrized over all three, as django-redis runs its suite once per
settings module: a test that takes it runs on each, with ``Lock(name)`` (no ``using``) going to
that topology."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from django_redis_lock import get_redis_client
from django_redis_lock.primitives.keys import lock_keys
from tests.support import factories
from tests.support.helpers import django_redis_caches, lease_token

QUORUM_MEMBERS = ["q0", "q1", "q2"]


@pytest.fixture
def on_cluster(settings: Any, redis_cluster: Any) -> Iterator[Any]:
    """The locks of the default alias on the test cluster (a ``RedisCluster`` client, through
    ``DJANGO_REDIS_LOCK_CONNECTION_FACTORY``)."""
    factories.cluster_url[:] = [redis_cluster.startup_url]
    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = "tests.support.factories.cluster_client"
    client = get_redis_client()
    assert isinstance(client, RedisCluster)
    yield client
    client.close()


@pytest.fixture
def quorum(settings: Any, redis_server_factory: Any, redis_url: str) -> Iterator[SimpleNamespace]:
    """Three private servers, each a cache alias (``q0``..``q2``), held as the quorum
    ``redlock``."""
    servers = [redis_server_factory() for _ in QUORUM_MEMBERS]
    caches = django_redis_caches(redis_url)
    for alias, server in zip(QUORUM_MEMBERS, servers, strict=True):
        caches[alias] = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "KEY_PREFIX": f"prefix-of-{alias}",  # ignored by quorum keys: one key everywhere
            "OPTIONS": {"SOCKET_TIMEOUT": 2, "SOCKET_CONNECT_TIMEOUT": 2},
        }
    settings.CACHES = caches
    settings.DJANGO_REDIS_LOCK_QUORUMS = {"redlock": QUORUM_MEMBERS}
    clients = [redis.Redis.from_url(server.url) for server in servers]
    yield SimpleNamespace(servers=servers, clients=clients, caches=caches)
    for server in servers:
        if server.pid:
            os.kill(server.pid, signal.SIGCONT)  # in case a test paused it and failed
    for client in clients:
        client.close()


@dataclass
class Topology:
    """Where ``Lock(name)`` goes now: ``kind``, the alias its keys are named for, and clients
    of the servers that keep each lease (a quorum's: every server)."""

    kind: str
    alias: str
    clients: list[Any]

    def lease_key(self, name: str) -> str:
        return lock_keys(name, self.alias).lease

    def leases(self, name: str) -> list[Any]:
        """The lease value of ``name`` on each server that keeps it."""
        return [client.get(self.lease_key(name)) for client in self.clients]

    def tokens(self, name: str) -> list[str | None]:
        """The owner token of ``name``'s lease on each server that keeps it."""
        return [lease_token(client, self.lease_key(name)) for client in self.clients]

    def delete_lease(self, name: str) -> None:
        """What an eviction, a restart or a hand in ``redis-cli`` does behind the holder."""
        for client in self.clients:
            client.delete(self.lease_key(name))


@pytest.fixture(params=["server", "cluster", "quorum"])
def topology(request: pytest.FixtureRequest, settings: Any, redis_client: Any) -> Topology:
    if request.param == "server":
        return Topology("server", "default", [redis_client])
    if request.param == "cluster":
        return Topology("cluster", "default", [request.getfixturevalue("on_cluster")])
    members = request.getfixturevalue("quorum")
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "redlock"
    return Topology("quorum", "redlock", members.clients)
