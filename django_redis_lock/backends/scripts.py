"""The lock engine's Lua scripts (``lua/*.lua``, loaded once) and the :class:`Script` that
calls them.

Each script is one ``EVALSHA`` (one round trip); on ``NOSCRIPT`` (after ``SCRIPT FLUSH`` or a
Redis restart) it is loaded and the call retried once. Scripts run atomically, so "check the
owner, then act" can never be split by another client. Every key a script touches is passed in
``KEYS`` (Redis Cluster's contract): all of one lock's keys share its hash tag, and a script
that would need a key it was not given (the wake-up list of a waiter it did not expect) returns
what to do instead.

The lease is one string, ``token|since_ms|fence|owner record`` (``lease.py``), so a free lock is
taken with a bare ``SET NX PX``, no script. The scripts, each documented at its top:

- ``take.lua``: a free lock with a fencing token, or quorum mode's attempt (never queues);
- ``take_many.lua``: ``lock_many``'s free locks, in one step, when they share a hash slot;
- ``join.lua``: the contended acquisition: take it if free, else queue and block;
- ``release.lua``: release, handing the lease straight to the first live waiter;
- ``extend.lua``: renewal and ``extend()``;
- ``wake.lua``: the wake-ups a release asks for (waiters it did not expect), each list with
  its expiry;
- ``permit_acquire.lua``, ``permit_release.lua``, ``permit_extend.lua``: the same three for a
  semaphore's permits (``Semaphore``), kept in a sorted set scored by lease end.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from ..core.durations import MAX_SECONDS
from ..core.flows import HANDOFF_MS
from ..core.permits import NEXT_WAITERS
from ..core.uncontended import LOST_RACE_RETRY_MS
from .replicas import aexecute_acknowledged, execute_acknowledged
from .wire import aexecute, execute

__all__ = [
    "EXTEND",
    "EXTEND_MANY",
    "JOIN",
    "PERMIT_ACQUIRE",
    "PERMIT_EXTEND",
    "PERMIT_RELEASE",
    "QUEUE_TTL_MS",
    "RELEASE",
    "SERVER_TIME",
    "TAKE",
    "TAKE_MANY",
    "WAKE",
    "Script",
    "load_script",
]

# ahead_ms() looks at most this far along the queue for a live waiter ahead of the caller.
AHEAD_LOOKS = 4
# The queue keys outlive every waiter's liveness deadline (at most 3 s, see flows.py).
QUEUE_TTL_MS = 5000


class Script:
    """A Lua script called by SHA, loaded on demand."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def run(
        self,
        send: Callable[..., Any],
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    ) -> Any:
        """Run the script with ``send(*command, reply_timeout=..., if_silent=...)``, the
        topology's way of sending one command (``wire.execute`` for one server,
        ``execute_on_cluster``...); loaded first if the server does not have it."""
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return send(*command, reply_timeout=reply_timeout, if_silent=if_silent)
        except NoScriptError:
            send("SCRIPT", "LOAD", self.source, reply_timeout=reply_timeout)
            return send(*command, reply_timeout=reply_timeout, if_silent=if_silent)

    async def arun(
        self,
        send: Callable[..., Awaitable[Any]],
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    ) -> Any:
        """:meth:`run` with an async ``send``."""
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return await send(*command, reply_timeout=reply_timeout, if_silent=if_silent)
        except NoScriptError:
            await send("SCRIPT", "LOAD", self.source, reply_timeout=reply_timeout)
            return await send(*command, reply_timeout=reply_timeout, if_silent=if_silent)

    def __call__(
        self,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    ) -> Any:
        """Run the script on one server's client (see :func:`execute` for ``reply_timeout``
        and ``if_silent``). Other topologies: their backend's ``run_script``."""
        return self.run(
            functools.partial(execute, client), keys, args,
            reply_timeout=reply_timeout, if_silent=if_silent,
        )  # fmt: skip

    def command(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The script as one command that needs nothing loaded (``EVAL`` of its source): for
        ``if_silent``, whose reply is never read, so a ``NOSCRIPT`` would go unseen."""
        return ("EVAL", self.source, len(keys), *keys, *args)

    def call_acknowledged(
        self, server: Any, keys: Sequence[str], args: Sequence[Any], replicas: int,
        timeout_ms: int, wanted: Callable[[Any], bool],
    ) -> tuple[Any, int]:  # fmt: skip
        """The script on one server's client, then ``WAIT`` for ``replicas`` if
        ``wanted(reply)``: see :func:`execute_acknowledged`."""
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return execute_acknowledged(server, command, replicas, timeout_ms, wanted)
        except NoScriptError:
            execute(server, "SCRIPT", "LOAD", self.source)
            return execute_acknowledged(server, command, replicas, timeout_ms, wanted)

    async def acall_acknowledged(
        self, client: Any, keys: Sequence[str], args: Sequence[Any], replicas: int,
        timeout_ms: int, wanted: Callable[[Any], bool],
    ) -> tuple[Any, int]:  # fmt: skip
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return await aexecute_acknowledged(client, command, replicas, timeout_ms, wanted)
        except NoScriptError:
            await aexecute(client, "SCRIPT", "LOAD", self.source)
            return await aexecute_acknowledged(client, command, replicas, timeout_ms, wanted)


# The scripts' clock: server_time(), now in ms and in µs, by the server's own (``TIME``). The
# one thing about a script that a deterministic simulation (tests/simulation/) replaces: it
# gives load_script() its own clock, first in the prelude (so it may also stand in for the
# server's clock of expiries, behind every ``redis.call`` after it).
SERVER_TIME = """
local function server_time()
  local t = redis.call('TIME')
  local seconds, micros = tonumber(t[1]), tonumber(t[2])
  return seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros
end"""


# Each script gets, before its own text, the constants, its clock (server_time(): now in ms
# and in µs, by the server's own ``TIME``) and those of the helpers below it calls: Lua makes a
# closure of each local function at every call, so a helper a script never calls is a cost
# paid on each call for nothing (the release of a free lock, the hottest script, is half as
# expensive without them). duration(): the milliseconds a script is given are checked before
# anything is written (Lua does not roll back, so an expiry Redis refused after a write would
# leave a key of ours without one); core/durations.py has checked them already, this is the last
# line. lease_fields(): the parts of a lease value. job_of(): the job id a token starts with
# (core/lease.py), or nil. taken_over(): whether a lease value starts with one of ARGV[first],
# ARGV[first + 1]...: a job's reservation, which the job's own acquisition takes over as if the
# lock were free. wants_result(): whether the flags ask for the guarded work's result; done():
# whether that result (read by the caller) answers this acquisition: any result with the 'd'
# flag, with 'j' only one naming the acquiring token's job (a finished run of the job).
# handoff_ms(): how long a lease handed to a waiter lasts until its new holder lengthens it:
# what it asked for, at most HANDOFF_MS, and never past the waiter's liveness deadline, so that
# a waiter that died before its turn holds the lock no longer than the queue would have counted
# it alive (a live one is blocked on its wake-up list, or asks again within its LIVENESS_SLACK:
# either way it takes over in time). ahead_ms(): ms until the first waiter ahead of ``token``
# in ``queue`` that is still counted alive is counted dead (0: none, among the first
# AHEAD_LOOKS): the waiter behind ends its block by then, since the lease may be handed to that
# one and end with its liveness.
# LEFT: the mark a leave (join.lua's and permit_acquire.lua's mode 3: an acquisition
# interrupted) leaves on the token's own wake-up list, for QUEUE_TTL_MS: a request of that token
# that arrives after it (sent on a connection the interruption closed, overtaken by the leave
# on another) queues nothing and takes nothing, and the block sent behind it pops the mark at
# once. No release's message looks like it (they start with a digit, or are empty); a token is
# one acquisition's, so nothing legitimate comes after its leave. mark_left(wake) leaves it;
# left_already(wake) finds it.
_CONSTANTS = f"""
local QUEUE_TTL_MS, HANDOFF_MS = {QUEUE_TTL_MS}, {HANDOFF_MS}
local LOST_RACE_RETRY_MS = {LOST_RACE_RETRY_MS}
local LEFT = '!left'
"""
_HELPERS = {
    "mark_left": """
local function mark_left(wake)
  redis.call('DEL', wake)
  redis.call('RPUSH', wake, LEFT)
  redis.call('PEXPIRE', wake, QUEUE_TTL_MS)
end""",
    "left_already": """
local function left_already(wake)
  return redis.call('LINDEX', wake, -1) == LEFT
end""",
    "duration": f"""
local function duration(value)
  local ms = tonumber(value)
  if not ms or ms < 1 or ms > {MAX_SECONDS * 1000} or ms % 1 ~= 0 then
    error('invalid duration: ' .. tostring(value) .. ' (whole milliseconds, at most a year)')
  end
  return ms
end""",
    "lease_fields": """
local function lease_fields(value)
  local a = string.find(value, '|', 1, true)
  local b = string.find(value, '|', a + 1, true)
  local c = string.find(value, '|', b + 1, true)
  return string.sub(value, 1, a - 1), string.sub(value, a + 1, b - 1),
    string.sub(value, b + 1, c - 1), string.sub(value, c + 1)
end""",
    "job_of": """
local function job_of(token)
  return string.match(token, '^([^~]+)~')
end""",
    "taken_over": """
local function taken_over(value, first)
  for i = first, #ARGV do
    if string.sub(value, 1, #ARGV[i]) == ARGV[i] then return true end
  end
  return false
end""",
    "wants_result": """
local function wants_result(flags)
  return string.find(flags, 'd', 1, true) or string.find(flags, 'j', 1, true)
end""",
    "done": """
local function done(flags, result, token)
  if not result then return false end
  if string.find(flags, 'd', 1, true) then return true end
  return string.find(flags, 'j', 1, true) ~= nil and result == job_of(token)
end""",
    "handoff_ms": """
local function handoff_ms(wanted, deadline, now)
  return math.max(1, math.min(duration(wanted), HANDOFF_MS, deadline - now))
end""",
    "ahead_ms": f"""
local function ahead_ms(queue, waiters, token, now)
  local first = redis.call('LRANGE', queue, 0, {AHEAD_LOOKS - 1})
  for _, waiter in ipairs(first) do
    if waiter == token then return 0 end
    local entry = redis.call('HGET', waiters, waiter)
    local deadline = entry and tonumber(string.match(entry, '^(%d+)|'))
    if deadline and deadline > now then return deadline - now end
  end
  return 0
end""",
}


# Also for a semaphore's scripts (``permit_*.lua``), whose KEYS start with the holders (a
# sorted set: token -> lease end, server ms), their owner records (a hash), the queue and the
# waiters. permits_purge(): drop the permits whose lease has ended. permits_expire(): both
# holder keys end with the last lease. permits_limit_of_first(): the limit the first holder
# took its permit under (``default`` when nobody holds one). live_ahead(): how many live
# waiters are ahead of ``token`` in the queue (all of them when it is not queued), counting up
# to ``most``; dead ones met on the way are dropped. NEXT_WAITERS: how many of the queue's
# first tokens a grant's message names (core/permits.py).
_PERMITS_CONSTANTS = f"""
local NEXT_WAITERS = {NEXT_WAITERS}
"""
_PERMITS_HELPERS = {
    "permits_purge": """
local function permits_purge(now)
  local ended = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #ended > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    for _, gone in ipairs(ended) do redis.call('HDEL', KEYS[2], gone) end
  end
end""",
    "permits_expire": """
local function permits_expire(now)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.max(1, tonumber(last[2]) - now)
    redis.call('PEXPIRE', KEYS[1], ms)
    redis.call('PEXPIRE', KEYS[2], ms)
  else
    redis.call('DEL', KEYS[2])
  end
end""",
    "permits_limit_of_first": """
local function permits_limit_of_first(default)
  local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  local entry = first and redis.call('HGET', KEYS[2], first)
  if not entry then return default end
  return tonumber(string.match(entry, '^%d+|(%d+)|')) or default
end""",
    "live_ahead": """
local function live_ahead(now, most, token)
  local ahead, index = 0, 0
  while ahead < most do
    local waiter = redis.call('LINDEX', KEYS[3], index)
    if not waiter or waiter == token then return ahead end
    local entry = redis.call('HGET', KEYS[4], waiter)
    if entry and tonumber(string.match(entry, '^(%d+)|')) >= now then
      ahead, index = ahead + 1, index + 1
    else
      redis.call('LREM', KEYS[3], 1, waiter)
      redis.call('HDEL', KEYS[4], waiter)
    end
  end
  return ahead
end""",
}


def _called(helpers: dict[str, str], source: str) -> str:
    """The definitions of those of ``helpers`` that ``source`` calls, directly or through
    another of them, in the order they are written (each before the helpers that call it)."""
    wanted: set[str] = set()
    texts = [source]
    while True:
        found = {
            name for name in helpers
            if name not in wanted and any(re.search(rf"\b{name}\(", text) for text in texts)
        }  # fmt: skip
        if not found:
            break
        wanted |= found
        texts = [helpers[name] for name in found]
    return "".join(text for name, text in helpers.items() if name in wanted)


def load_script(name: str, *, server_time: str = SERVER_TIME) -> Script:
    """The script ``lua/<name>.lua``, after the constants, its clock and the helpers above
    that it calls (and a semaphore's, for ``permit_*``). ``server_time``: the Lua definition
    of ``server_time()`` (the script's clock; :data:`SERVER_TIME`, the server's, unless a
    simulation brings its own: always included, since it may also stand in for the server's
    clock of expiries, behind every ``redis.call`` after it)."""
    source = resources.files(__package__).joinpath(f"lua/{name}.lua").read_text("utf-8")
    helpers = dict(_HELPERS)
    prelude = _CONSTANTS + server_time.strip()
    if name.startswith("permit_"):
        helpers.update(_PERMITS_HELPERS)
        prelude += _PERMITS_CONSTANTS
    return Script(name, prelude + _called(helpers, source) + "\n" + source)


TAKE = load_script("take")
TAKE_MANY = load_script("take_many")
JOIN = load_script("join")
RELEASE = load_script("release")
EXTEND = load_script("extend")
EXTEND_MANY = load_script("extend_many")
PERMIT_ACQUIRE = load_script("permit_acquire")
PERMIT_RELEASE = load_script("permit_release")
PERMIT_EXTEND = load_script("permit_extend")
WAKE = load_script("wake")
