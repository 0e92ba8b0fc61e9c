"""A Redis that may evict lock keys (``maxmemory`` with ``allkeys-lru``, a cache's usual setting)
is told at deploy time (``check --deploy``: W003) and in the log of each process's first lock,
read with one ``INFO memory`` per server: on one server, Sentinel, every primary of a Cluster,
every member of a quorum; quiet when Redis cannot be reached, and never an error of a lock."""

from __future__ import annotations

import io
import logging
from contextlib import contextmanager

import pytest
import redis
from django.core import checks
from django.core.management import call_command

from django_redis_lock import Lock, LockBackendError, Semaphore, acl_rule
from django_redis_lock.registry import eviction_warnings
from tests.conftest import django_redis_caches
from tests.support.helpers import as_user, make_acl_user, run_async
from tests.topologies.test_sentinel import sentinel_setup as sentinel_setup  # a fixture

EVICTING = ["--maxmemory", "50mb", "--maxmemory-policy", "allkeys-lru"]
MAY_EVICT = "may evict lock keys"


def deploy_warnings() -> list[checks.CheckMessage]:
    return [
        message
        for message in checks.run_checks(include_deployment_checks=True)
        if message.id == "django_redis_lock.W003"
    ]


def logged(caplog, text: str, level: int = logging.WARNING) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "django_redis_lock"
        and record.levelno == level
        and text in record.getMessage()
    ]


def info_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_info", {}).get("calls", 0))


def as_user_without_info(settings, server) -> None:
    """The locks on ``server`` as a Redis user whose ACL rule (older than the locks' rule of
    today) lacks ``INFO memory``: a server that refuses it, as some managed services do."""
    settings.CACHES = django_redis_caches(server.url)
    rule = acl_rule().replace(" +info|memory", "")
    assert rule != acl_rule()
    make_acl_user(redis.Redis.from_url(server.url), "locks", "pw", rule)
    settings.CACHES = django_redis_caches(as_user(server.url, "locks", "pw"), SOCKET_TIMEOUT=2)


@contextmanager
def evicting(*clients: redis.Redis):
    """Servers the suite shares (the Cluster's), set to evict for one test only."""
    for client in clients:
        client.config_set("maxmemory", "50mb")
        client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        yield
    finally:
        for client in clients:
            client.config_set("maxmemory", "0")
            client.config_set("maxmemory-policy", "noeviction")


# -- manage.py check --deploy --------------------------------------------------------------------


def test_check_deploy_warns_of_a_redis_that_may_evict_lock_keys(settings, redis_server_factory):
    server = redis_server_factory(args=EVICTING)
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=2)
    out, err = io.StringIO(), io.StringIO()
    call_command("check", "--deploy", stdout=out, stderr=err)
    output = out.getvalue() + err.getvalue()
    assert "(django_redis_lock.W003)" in output
    assert f"Redis at {server.host}:{server.port} {MAY_EVICT}" in output
    assert "maxmemory 50.00M, maxmemory-policy allkeys-lru" in output
    assert "it contacts Redis" in output  # a deploy check that asks the server says so
    # Only with --deploy: runserver, migrate and the tests' checks never contact Redis.
    assert [m for m in checks.run_checks() if m.id.startswith("django_redis_lock.")] == []


@pytest.mark.parametrize(
    "args",
    [
        ["--maxmemory", "50mb", "--maxmemory-policy", "noeviction"],
        ["--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"],  # no limit: nothing evicted
    ],
    ids=["noeviction", "no-maxmemory"],
)
def test_check_deploy_is_quiet_on_a_redis_that_keeps_lock_keys(
    settings, redis_server_factory, args
):
    server = redis_server_factory(args=args)
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=2)
    assert deploy_warnings() == []


def test_check_deploy_is_quiet_when_redis_cannot_be_reached(settings):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0", SOCKET_TIMEOUT=2)
    assert deploy_warnings() == []
    out, err = io.StringIO(), io.StringIO()
    call_command("check", "--deploy", stdout=out, stderr=err)  # no error either
    assert "django_redis_lock" not in out.getvalue() + err.getvalue()


def test_check_deploy_says_when_it_could_not_read_the_policy(settings, redis_server_factory):
    server = redis_server_factory(args=EVICTING)
    as_user_without_info(settings, server)
    [warning] = deploy_warnings()
    assert warning.msg.startswith(f"Could not read the eviction policy of Redis at {server.host}")
    assert "maxmemory-policy is noeviction" in warning.msg


# -- every topology: each server that holds lock keys ---------------------------------------------


def test_through_sentinel_the_primary_is_read(sentinel_setup):
    primary, _, _, master = sentinel_setup
    redis.Redis.from_url(primary.url).config_set("maxmemory-policy", "allkeys-lru")
    redis.Redis.from_url(primary.url).config_set("maxmemory", "50mb")
    [warning] = eviction_warnings()
    assert warning.startswith(f"Redis at {master} (Sentinel's primary) {MAY_EVICT}")
    assert [message.id for message in deploy_warnings()] == ["django_redis_lock.W003"]


def test_on_a_cluster_every_primary_is_read(on_cluster, redis_cluster):
    nodes = [redis.Redis.from_url(server.url) for server in redis_cluster.servers]
    assert eviction_warnings() == []
    with evicting(nodes[1], nodes[2]):
        warnings = eviction_warnings()
    named = sorted(f"{server.host}:{server.port}" for server in redis_cluster.servers[1:])
    assert sorted(warning.split()[2] for warning in warnings) == named
    assert all(MAY_EVICT in warning for warning in warnings)
    for node in nodes:
        node.close()


def test_in_quorum_mode_every_member_is_read(settings, quorum):
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "redlock"
    quorum.clients[2].config_set("maxmemory", "50mb")
    quorum.clients[2].config_set("maxmemory-policy", "volatile-ttl")  # ours all have a TTL
    [warning] = eviction_warnings()
    assert warning.startswith(f"Redis at q2 {MAY_EVICT}")
    assert "volatile-ttl" in warning
    [deploy_warning] = deploy_warnings()
    assert deploy_warning.msg.startswith(warning)


# -- the first lock of a process -----------------------------------------------------------------


def test_the_first_lock_logs_the_warning_once(settings, redis_server_factory, caplog):
    server = redis_server_factory(args=EVICTING)
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=2)
    client = redis.Redis.from_url(server.url)
    client.config_resetstat()
    caplog.set_level(logging.INFO, logger="django_redis_lock")
    with Lock("evicted:first", timeout=10):
        [warning] = logged(caplog, MAY_EVICT)
        assert warning.startswith(f"Redis at {server.host}:{server.port} {MAY_EVICT}")
    with Lock("evicted:second", timeout=10), Semaphore("evicted:third", 2):
        pass
    assert len(logged(caplog, MAY_EVICT)) == 1
    assert info_calls(client) == 1  # one INFO memory, once for the process and alias


def test_the_first_async_lock_logs_it_once_without_blocking_the_loop(
    settings, redis_server_factory, caplog
):
    server = redis_server_factory(args=EVICTING)
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=2)
    client = redis.Redis.from_url(server.url)
    client.config_resetstat()
    caplog.set_level(logging.INFO, logger="django_redis_lock")

    async def main():
        async with Lock("evicted:async", timeout=10):
            pass
        async with Lock("evicted:async-again", timeout=10):
            pass

    run_async(main())  # (asyncio.run waits for the loop's worker threads before it returns)
    [warning] = logged(caplog, MAY_EVICT)
    assert warning.startswith(f"Redis at {server.host}:{server.port} {MAY_EVICT}")
    assert info_calls(client) == 1


def test_each_quorum_member_is_asked_once(settings, quorum, caplog):
    settings.DJANGO_REDIS_LOCK_CACHE_ALIAS = "redlock"
    for client in quorum.clients:
        client.config_resetstat()
    quorum.clients[0].config_set("maxmemory", "50mb")
    quorum.clients[0].config_set("maxmemory-policy", "allkeys-lfu")
    caplog.set_level(logging.INFO, logger="django_redis_lock")
    for name in ("quorum:first", "quorum:second"):
        with Lock(name, timeout=10):
            pass
    assert [warning.split()[2] for warning in logged(caplog, MAY_EVICT)] == ["q0"]
    assert [info_calls(client) for client in quorum.clients] == [1, 1, 1]


def test_a_redis_that_refuses_info_still_gives_its_locks(settings, redis_server_factory, caplog):
    server = redis_server_factory(args=EVICTING)
    as_user_without_info(settings, server)
    caplog.set_level(logging.INFO, logger="django_redis_lock")
    with Lock("refused:info", timeout=10) as held:
        assert held.owned()
    [advice] = logged(caplog, "Could not read the eviction policy", logging.INFO)
    assert "maxmemory-policy is noeviction" in advice
    assert logged(caplog, "eviction", logging.WARNING) == []


def test_on_an_unreachable_redis_a_lock_fails_as_it_did_and_the_advice_is_silent(settings, caplog):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0", SOCKET_TIMEOUT=2)
    caplog.set_level(logging.INFO, logger="django_redis_lock")
    with pytest.raises(LockBackendError, match="Could not acquire lock 'unreachable'"):
        Lock("unreachable", timeout=10, wait=0).acquire()
    assert [r for r in caplog.records if "eviction" in r.getMessage()] == []
