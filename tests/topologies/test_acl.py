"""Least privilege and managed services: the ACL rule the locks document (``acl_rule()``,
``manage.py redis_locks acl``), a Redis user with exactly that rule, and servers that refuse or
rename commands (``rename-command``, as managed services do): what needs a refused command is
named in a typed error, and nothing is left held.

The lock, semaphore, views and admin test modules themselves also run as such a user:
``TEST_REDIS_USER=locks`` (tests/conftest.py ``locks_url``; CI runs them so).
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.core.management import call_command

from dev.embedded_redis import EmbeddedRedis
from django_redis_lock import CommandRefused, Lock, Semaphore, acl_rule
from django_redis_lock.backends.acl import COMMANDS, needed_for, refused_command
from django_redis_lock.backends.base import SCRIPTS
from django_redis_lock.primitives.keys import lock_keys
from django_redis_lock.registry import eviction_warnings
from tests.support import factories, promises
from tests.support.helpers import (
    as_user,
    django_redis_caches,
    lease_token,
    make_acl_user,
    refused_by_acl,
)

PASSWORD = "locks-password"


@pytest.fixture
def admin_server(redis_server_factory: Any) -> EmbeddedRedis:
    """A private server whose default user needs a password (the tests' admin)."""
    return redis_server_factory(password="admin-password")


@pytest.fixture
def locks_user(settings: Any, admin_server: EmbeddedRedis) -> Callable[..., redis.Redis]:
    """``make(rule=acl_rule(), user="locks")``: create that Redis user and point the default
    cache (and so the locks) at it; returns the admin's client of the server."""
    admin = redis.Redis.from_url(admin_server.url)

    def make(rule: str | None = None, user: str = "locks") -> redis.Redis:
        if rule is None:
            settings.CACHES = django_redis_caches(admin_server.url, SOCKET_TIMEOUT=2)
            rule = acl_rule()
        make_acl_user(admin, user, PASSWORD, rule)
        settings.CACHES = django_redis_caches(
            as_user(admin_server.url, user, PASSWORD), SOCKET_TIMEOUT=2
        )
        return admin

    yield make
    admin.close()


def test_the_rule_is_the_locks_namespace_and_their_commands(settings):
    settings.CACHES = django_redis_caches("redis://127.0.0.1:1/0")
    settings.CACHES["default"]["KEY_PREFIX"] = "shop*1"
    out = io.StringIO()
    call_command("redis_locks", "acl", "--user", "shop-locks", stdout=out, stderr=io.StringIO())
    command = out.getvalue().strip()
    assert command.startswith(
        r"ACL SETUSER shop-locks on >PASSWORD resetkeys ~shop\*1:lock:* resetchannels -@all "
    )  # a glob character of the prefix matches only itself
    granted = {part[1:] for part in command.split() if part.startswith("+")}
    assert {"evalsha", "blpop", "scan", "wait", "time", "info|memory"} <= granted
    assert not granted & {"config|get", "info", "keys", "flushdb", "flushall", "debug", "@all"}


def test_the_rule_of_a_cluster_lets_redis_py_read_the_slot_map(on_cluster):
    granted = set(acl_rule().split())
    assert {"+cluster|slots", "+command"} <= granted


def test_as_the_acl_user_nothing_outside_the_rule_is_sent(locks_user, admin_server, admin_client):
    admin = locks_user()
    with Lock("acl:lock", timeout=10, fencing=True) as held:
        assert lease_token(admin, lock_keys("acl:lock", "default").lease) == held.token
        page = admin_client.get("/admin/django_redis_lock/heldlock/")
        assert "acl:lock" in page.content.decode()
        # The eviction advice reads INFO memory, which the rule grants: nothing to say here.
        assert "eviction policy" not in page.content.decode()
        assert eviction_warnings() == []
    promises.a_waiter_gets_the_lock_after_the_release("acl:wait")
    with Semaphore("acl:semaphore", 2) as first, Semaphore("acl:semaphore", 2):
        assert first.owned()
        assert not Semaphore("acl:semaphore", 2, wait=0).acquire()
    promises.the_async_api_waits_without_blocking_the_loop("acl:async")
    assert refused_by_acl(admin) == []
    # The rule does refuse what is outside it: another key, another command.
    locks_client = redis.Redis.from_url(as_user(admin_server.url, "locks", PASSWORD))
    with pytest.raises(redis.exceptions.NoPermissionError):
        locks_client.set("not-a-lock", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        locks_client.flushdb()
    locks_client.close()


def test_a_refused_command_is_named_with_what_needs_it(settings, locks_user):
    without_blpop = acl_rule().replace(" +blpop", "")
    admin = locks_user(without_blpop)
    holder = Lock("acl:no-blpop", timeout=10)
    holder.acquire()
    with pytest.raises(CommandRefused) as refused:
        Lock("acl:no-blpop", wait=2).acquire()
    assert refused.value.command == "BLPOP"
    assert "waiting for a lock" in str(refused.value)
    assert "redis_locks acl" in str(refused.value)
    holder.release()
    assert not admin.exists(lock_keys("acl:no-blpop", "default").lease)


def test_a_key_outside_the_rule_is_named(settings, locks_user):
    locks_user(acl_rule().replace("~lock:*", "~other:*"))
    with pytest.raises(CommandRefused) as refused:
        Lock("acl:elsewhere", timeout=10).acquire()
    assert refused.value.command is None
    assert "key patterns must cover the locks' keys" in str(refused.value)


@pytest.mark.parametrize("refusal", ["acl", "renamed"])
def test_min_replicas_without_wait_is_a_clear_error_and_nothing_stays_held(
    settings, locks_user, redis_server_factory, refusal
):
    if refusal == "acl":
        admin = locks_user(acl_rule().replace(" +wait", ""))
    else:
        server = redis_server_factory(args=["--rename-command", "WAIT", ""])
        settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=2)
        admin = redis.Redis.from_url(server.url)
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    lease = lock_keys("acl:replicated", "default").lease
    with pytest.raises(CommandRefused) as refused:
        Lock("acl:replicated", timeout=30).acquire()
    assert refused.value.command == "WAIT"
    assert "DJANGO_REDIS_LOCK_MIN_REPLICAS = 0" in str(refused.value)
    assert not admin.exists(lease)  # given back, not held for 30 s by nobody

    async def main() -> None:
        with pytest.raises(CommandRefused, match="WAIT"):
            await Lock("acl:replicated", timeout=30).aacquire()

    asyncio.run(main())
    assert not admin.exists(lease)


def test_a_managed_service_without_config_wait_and_debug(settings, redis_server_factory):
    renamed = ("CONFIG", "WAIT", "DEBUG")
    server = redis_server_factory(
        args=[
            *(
                "--maxmemory",
                "50mb",
                "--maxmemory-policy",
                "volatile-lru",
            ),  # ElastiCache's default
            *(part for command in renamed for part in ("--rename-command", command, "")),
        ]
    )
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=2)
    with Lock("managed:lock", timeout=10) as held:
        assert held.owned()
        # Read without CONFIG (INFO memory), so the advice is the policy's, not "make sure".
        [warning] = eviction_warnings()
        assert "may evict lock keys" in warning
        assert "maxmemory-policy volatile-lru" in warning
    promises.a_waiter_gets_the_lock_after_the_release("managed:wait")


def test_a_user_whose_rule_lacks_info_is_told_to_check_the_policy(settings, locks_user):
    admin = locks_user(acl_rule().replace(" +info|memory", ""))
    with Lock("acl:no-info", timeout=10) as held:  # the first lock's advice cannot stop it
        assert held.owned()
        [warning] = eviction_warnings()
    assert warning.startswith("Could not read the eviction policy of Redis at")
    assert "maxmemory-policy is noeviction" in warning
    assert refused_by_acl(admin) == ["info"]  # and nothing else


def test_a_server_without_lua_fails_at_first_use_with_one_message(settings, redis_server_factory):
    no_lua = ("EVAL", "EVALSHA", "SCRIPT")  # (Redis 7's FUNCTION and FCALL: the locks use none)
    server = redis_server_factory(
        args=[part for command in no_lua for part in ("--rename-command", command, "")]
    )
    settings.CACHES = django_redis_caches(server.url, SOCKET_TIMEOUT=2)
    with pytest.raises(CommandRefused) as refused:
        Lock("nolua:lock", timeout=10).acquire()
    assert "runs no Lua" in str(refused.value)
    assert refused.value.needed_for == "every lock operation (the locks are Lua scripts)"
    assert redis.Redis.from_url(server.url).dbsize() == 0


@pytest.mark.parametrize(
    ("reply", "command"),
    [
        ("unknown command 'WAIT', with args beginning with: '1' '500'", "WAIT"),
        ("ERR unknown command `EVALSHA`, with args beginning with: ", "EVALSHA"),
        ("NOPERM User locks has no permissions to run the 'blpop' command", "BLPOP"),
        ("NOPERM this user has no permissions to run the 'script|load' command", "SCRIPT|LOAD"),
        ("NOPERM No permissions to access a key", "a key outside the user's ACL key patterns"),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", None),
    ],
)
def test_refusals_as_servers_word_them(reply, command):
    assert refused_command(redis.ResponseError(reply)) == command


def test_every_refusable_command_says_what_needs_it():
    assert "MIN_REPLICAS" in needed_for("wait")
    assert needed_for("SCRIPT") == needed_for("script load") == needed_for("EVALSHA")
    assert needed_for("FLUSHALL") is None


def test_on_a_cluster_as_the_acl_user(on_cluster, redis_cluster, settings):
    """The rule of a Cluster (with what redis-py's Cluster client reads itself) on every node;
    the locks' Cluster client logs in as that user."""
    rule = acl_rule()
    nodes = [redis.Redis.from_url(server.url) for server in redis_cluster.servers]
    for node in nodes:
        make_acl_user(node, "locks", PASSWORD, rule)
    try:
        factories.cluster_url[:] = [as_user(redis_cluster.startup_url, "locks", PASSWORD)]
        settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = "tests.support.factories.cluster_client"
        names = [f"acl:cluster:{n}" for n in range(6)]  # over several slots, so several nodes
        for name in names:
            with Lock(name, timeout=10) as held:
                assert held.owned()
        promises.a_waiter_gets_the_lock_after_the_release("acl:cluster:wait")
        assert [entry for node in nodes for entry in refused_by_acl(node)] == []
    finally:
        for node in nodes:
            node.execute_command("ACL", "DELUSER", "locks")
            node.close()


def test_every_command_a_script_calls_is_in_the_rule():
    """An ACL applies to what a script calls: a command a script calls that the rule leaves out
    is refused inside the script, on a path the ACL tests may not take (a fair=False retry)."""
    called = {
        name.upper()
        for script in SCRIPTS.values()
        for name in re.findall(r"redis\.p?call\('(\w+)'", script.source)
    }
    assert called
    assert called <= set(COMMANDS), sorted(called - set(COMMANDS))
