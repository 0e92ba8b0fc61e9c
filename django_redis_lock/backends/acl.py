"""Every command the locks send to Redis, by what needs it.

Two uses of one table: the least-privilege ACL rule for a Redis user of the locks alone
(:func:`acl_rule`, printed by ``manage.py redis_locks acl``), and, when a server refuses a
command (an ACL without it, a managed service that renamed or disabled it), the error that names
what needs it (:func:`needed_for`). ``tests/topologies/test_acl.py`` runs the locks,
semaphores, views and admin as a user with exactly this rule and finds nothing refused.

The commands inside the Lua scripts are here too: an ACL applies to what a script calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "CLUSTER_CLIENT_COMMANDS",
    "COMMANDS",
    "KEY_REFUSED",
    "LUA_SCRIPTING",
    "OPTIONAL_COMMANDS",
    "acl_rule",
    "needed_for",
    "refusal_text",
    "refused_command",
]

LUA_SCRIPTING = "every lock operation (the locks are Lua scripts)"
# What the scripts call (backends/lua/ and scripts.py).
_SCRIPT_CALLS = (
    "GET", "SET", "DEL", "PEXPIRE", "PTTL", "RPUSH", "LPOP", "LINDEX", "LRANGE", "LREM",
    "HGET", "HSET", "HDEL", "HINCRBY", "ZADD", "ZREM", "ZCARD", "ZRANGE", "ZRANGEBYSCORE",
    "ZREMRANGEBYSCORE", "ZSCORE", "TIME",
)  # fmt: skip

COMMANDS: dict[str, str] = {
    # The scripts themselves, loaded once and run by their digest.
    "EVALSHA": LUA_SCRIPTING,
    "EVAL": LUA_SCRIPTING,
    "SCRIPT|LOAD": LUA_SCRIPTING,
    **dict.fromkeys(_SCRIPT_CALLS, LUA_SCRIPTING),
    "BLPOP": "waiting for a lock (each waiter blocks on its own wake-up list)",
    "WAIT": "DJANGO_REDIS_LOCK_MIN_REPLICAS (writes confirmed by replicas)",
    "SCAN": "listing live locks (the admin's Locks and Hot locks pages, "
    "`manage.py redis_locks list`, the metrics' census)",
    "EXISTS": "reading a lock's state (owned(), the admin)",
    "LLEN": "reading a lock's waiters (the admin, the metrics' census)",
    "HGETALL": "reading a lock's waiters (the admin, `manage.py redis_locks show`)",
    # The memory section only (a first argument in an ACL rule, from Redis 6.2 and Valkey).
    "INFO|MEMORY": "reading whether Redis may evict lock keys (maxmemory, maxmemory-policy): "
    "each process's first lock, the admin, `redis_locks list`, `check --deploy`",
    # What redis-py sends on a new connection: a health check, the database, RESP3.
    "PING": "redis-py's connection health check",
    "SELECT": "a database other than 0 in the cache's LOCATION",
    "HELLO": "redis-py's RESP3 connections (protocol=3)",
}
# What redis-py's Cluster client reads on its own: the slot map and the commands' key positions.
CLUSTER_CLIENT_COMMANDS: dict[str, str] = {
    "CLUSTER|SLOTS": "redis-py's Cluster client (the slot map)",
    "COMMAND": "redis-py's Cluster client (where each command's keys are)",
}
# Never granted. redis-py names its connections (Redis 7.2+, Valkey) and ignores a refusal;
# the rule leaves it out because a Redis 7.0 ACL refuses to name a command it lacks.
OPTIONAL_COMMANDS = {
    "CLIENT|SETINFO": "redis-py naming its connections (it ignores a refusal)",
}


# How servers word a refusal: a command unknown (renamed away, disabled, no Lua module), or
# not allowed by the user's ACL, or a key outside its key patterns (Redis 6.2-8 and Valkey
# spell them alike; redis-py takes the NOPERM prefix off).
_UNKNOWN = re.compile(r"unknown command [`'\"]?([^`'\" ,]+)", re.IGNORECASE)
_NOT_ALLOWED = re.compile(r"no permissions to run the [`'\"]([^`'\"]+)[`'\"]", re.IGNORECASE)
_KEY_NOT_ALLOWED = re.compile(r"no permissions to access", re.IGNORECASE)
KEY_REFUSED = "a key outside the user's ACL key patterns"


def refusal_text(error: BaseException | str) -> str:
    """A server's refusal, for people: without the arguments it echoes back."""
    return str(error).split(", with args beginning with", 1)[0].strip()


def refused_command(error: BaseException) -> str | None:
    """The command a server refused in the error reply ``error``, upper-case (``"WAIT"``,
    ``"SCRIPT|LOAD"``); :data:`KEY_REFUSED` when the ACL refused a key; None when ``error``
    is not a refusal."""
    text = str(error)
    found = _UNKNOWN.search(text) or _NOT_ALLOWED.search(text)
    if found:
        return found.group(1).upper()
    if _KEY_NOT_ALLOWED.search(text):
        return KEY_REFUSED
    return None


def needed_for(command: str) -> str | None:
    """What needs ``command`` (``"WAIT"``, ``"script|load"``), or None if the locks never send
    it."""
    name = command.upper().replace(" ", "|")
    table = {**COMMANDS, **CLUSTER_CLIENT_COMMANDS, **OPTIONAL_COMMANDS}
    # A subcommand refused as its container (``unknown command 'SCRIPT'``), or the reverse.
    related = (need for command, need in table.items() if command.split("|", 1)[0] == name)
    return table.get(name) or table.get(name.split("|", 1)[0]) or next(related, None)


def acl_rule(key_prefixes: Iterable[str], client_commands: Iterable[str] = ()) -> str:
    """The ACL rule (what follows ``ACL SETUSER <user> on ><password>``) for a user of the locks
    alone: their keys (every key starts with one of ``key_prefixes``) and their commands, with
    what the client sends on its own for its topology (``Backend.client_commands``)."""
    commands = [*COMMANDS, *client_commands]
    keys = " ".join(f"~{_glob_escaped(prefix)}*" for prefix in sorted(set(key_prefixes)))
    granted = " ".join(f"+{command.lower()}" for command in commands)
    return f"resetkeys {keys} resetchannels -@all {granted}"


def _glob_escaped(text: str) -> str:
    # An ACL key pattern is a glob: a prefix's own *, ?, [ or \ must match only themselves.
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)
