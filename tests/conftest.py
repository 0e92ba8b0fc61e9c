"""Real-Redis fixtures: private redis-server processes, never a mock.

- ``redis_url``: the session's server. Set ``REDIS_URL`` to use an external server instead
  (give it a dedicated database number: the suite empties that database before every test).
  Without it, a private ``redis-server`` is started on a free loopback port.
- ``redis_server_factory``: starts extra private servers for one test (restarts, replicas,
  clusters) and stops them, by pid, when the test ends.
- ``redis_client``: a redis-py client on the session's database, emptied before each test.
- after every test, no key of ours in the session's database may be left without an expiry
  (``planted``: the keys a test wrote by hand, which are exempt).
- ``redis_proxy``: the session's server behind a TCP proxy that can lose replies.
- ``server_clock``: the scripts' clock, driven by the test (``tests/support/server_clock.py``),
  on the session's server: scripts loaded with ``server_clock.script(name)`` see the time it
  sets.
- ``broker_url``: a private redis-server of its own, the real task-queue workers' broker and
  result backend (never emptied between tests, so a worker started once serves many).
- ``topology`` (``tests/support/topologies.py``): each test that takes it runs on one server,
  a Redis Cluster and a quorum; ``on_cluster`` and ``quorum`` set up one of them.

``TEST_REDIS_USER=locks`` runs the locks as a Redis user with exactly the ACL rule they
document (``locks_url``).

``TEST_SERVER=valkey`` (``make test SERVER=valkey``) runs every server the suite starts (the
session's, Cluster nodes, Sentinels, quorum members) on ``valkey-server`` instead of
``redis-server``; the TLS tests take the first binary built with TLS, whichever it is.
"""

from __future__ import annotations

import os
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.db import connections
from django.test import override_settings

from dev.embedded_redis import (
    EmbeddedRedis,
    RedisServerNotFound,
    find_redis_server,
    find_valkey_server,
    start_cluster,
)
from django_redis_lock import acl_rule
from tests.support.helpers import (  # (tests import it from here)
    as_user,
    django_redis_caches,
    keys_without_ttl,
    make_acl_user,
    refused_by_acl,
)
from tests.support.proxy import TcpProxy
from tests.support.server_clock import DrivenClock
from tests.support.topologies import on_cluster, quorum, topology  # noqa: F401 (fixtures)

ServerFactory = Callable[..., EmbeddedRedis]
SERVERS = {"redis": find_redis_server, "valkey": find_valkey_server}


def pytest_configure(config: pytest.Config) -> None:
    chosen = os.environ.get("TEST_SERVER", "redis")
    if chosen not in SERVERS:
        raise pytest.UsageError(f"TEST_SERVER={chosen!r}: it is one of {', '.join(SERVERS)}.")
    if chosen != "redis":
        # Every EmbeddedRedis the suite (and each process it starts) runs reads $REDIS_SERVER.
        os.environ["REDIS_SERVER"] = SERVERS[chosen]()


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get("REDIS_URL"):
        return f"server: REDIS_URL={os.environ['REDIS_URL']}"
    try:
        binary = find_redis_server()
    except RedisServerNotFound:  # tests/engine needs none
        return "server: none found (only the tests that need no server can run)"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return f"server: {version.strip()} ({binary})"


class _Servers:
    def __init__(self, directory_factory: Callable[[], Any]) -> None:
        self._directory_factory = directory_factory
        self.started: list[EmbeddedRedis] = []

    def start(self, **kwargs: Any) -> EmbeddedRedis:
        kwargs.setdefault("directory", self._directory_factory())
        server = EmbeddedRedis(**kwargs).start()
        self.started.append(server)
        return server

    def stop_all(self) -> None:
        while self.started:
            self.started.pop().stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("REDIS_URL")
    if external:
        yield external
        return
    servers = _Servers(lambda: tmp_path_factory.mktemp("redis-session"))
    try:
        yield servers.start().url
    finally:
        servers.stop_all()


@pytest.fixture(scope="session")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    servers = _Servers(lambda: tmp_path_factory.mktemp("broker"))
    try:
        yield servers.start().url
    finally:
        servers.stop_all()


@pytest.fixture(scope="session")
def locks_url(redis_url: str) -> Iterator[str]:
    """What the default cache, and so the locks, connect with: the session's URL, or with
    ``TEST_REDIS_USER=<name>``, that Redis user's, made with exactly :func:`acl_rule` (the rule
    docs/servers.md gives). Then every command or key the rule does not allow is refused, and
    the session fails if the server's ACL log shows any. The tests' own ``redis_client`` stays
    the default user."""
    user = os.environ.get("TEST_REDIS_USER")
    if not user:
        yield redis_url
        return
    admin = redis.Redis.from_url(redis_url)
    with override_settings(CACHES=django_redis_caches(redis_url)):
        rule = acl_rule()
    make_acl_user(admin, user, "locks-password", rule)
    yield as_user(redis_url, user, "locks-password")
    refused = refused_by_acl(admin)
    admin.close()
    assert refused == [], f"the ACL refused what the locks sent: {refused}"


@pytest.fixture(scope="session", autouse=True)
def _caches_on_test_redis(locks_url: str) -> Iterator[None]:
    with override_settings(CACHES=django_redis_caches(locks_url)):
        yield


@pytest.fixture(scope="session", autouse=True)
def _database_features_read(django_db_setup: None, django_db_blocker: Any) -> None:
    """Django 6.1's system checks ask the database whether it supports JSON fields (the
    django-tasks-db model has one), which pytest-django refuses outside a database test: so
    whether a test running ``check`` passed depended on whether another had asked first.
    Asked once here, for every connection."""
    with django_db_blocker.unblock():
        for connection in connections.all():
            connection.features.supports_json_field  # noqa: B018 (read, and kept)


@pytest.fixture(scope="session")
def _session_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def redis_client(_session_client: redis.Redis) -> redis.Redis:
    return _session_client


@pytest.fixture(autouse=True)
def _clean_redis_db(_session_client: redis.Redis) -> None:
    # Only the session database (ours, or the one REDIS_URL names) is ever flushed.
    _session_client.flushdb()


@pytest.fixture(autouse=True)
def _every_key_of_ours_expires(_session_client: redis.Redis) -> Iterator[set[str]]:
    # The invariant the error paths must keep: whatever failed, no key of ours is left
    # without an expiry (a lock nobody could ever take again).
    planted: set[str] = set()
    yield planted
    leftovers = keys_without_ttl(_session_client, exempt=planted)
    assert leftovers == [], f"keys of ours left without an expiry: {leftovers}"


@pytest.fixture
def server_clock(redis_client: redis.Redis) -> DrivenClock:
    """The scripts' clock, driven by the test (``tests/support/server_clock.py``)."""
    return DrivenClock(redis_client)


@pytest.fixture
def planted(_every_key_of_ours_expires: set[str]) -> set[str]:
    """Add the keys the test writes by hand without an expiry: they are not the lock's doing."""
    return _every_key_of_ours_expires


@pytest.fixture
def redis_proxy(redis_url: str) -> Iterator[TcpProxy]:
    """The session's server behind a TCP proxy; ``redis_proxy.url`` is its address."""
    parts = urllib.parse.urlsplit(redis_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    proxy.url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def redis_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    servers = _Servers(lambda: tmp_path_factory.mktemp("redis"))
    try:
        yield servers.start
    finally:
        servers.stop_all()


class _Cluster:
    """A Redis Cluster of private servers on loopback, slots split evenly between them."""

    def __init__(self, servers: list[EmbeddedRedis]) -> None:
        self.servers = servers

    @property
    def startup_url(self) -> str:
        return self.servers[0].url

    def client(self) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(self.startup_url)


@pytest.fixture(scope="session")
def _session_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Cluster]:
    """Three primaries in cluster mode, slots assigned, gossip settled (once per session)."""
    pool = _Servers(lambda: tmp_path_factory.mktemp("cluster"))
    servers = start_cluster(3, start=pool.start)
    try:
        yield _Cluster(servers)
    finally:
        pool.stop_all()


@pytest.fixture
def redis_cluster(_session_cluster: _Cluster) -> _Cluster:
    """The test cluster, every node emptied for this test."""
    for server in _session_cluster.servers:
        client = redis.Redis.from_url(server.url)
        client.flushall()
        client.close()
    return _session_cluster
