"""The Lua scripts of the lock engine, and the :class:`Script` that calls them.

Each lock operation is one ``EVALSHA`` (one round trip); on ``NOSCRIPT`` (after ``SCRIPT
FLUSH`` or a Redis restart) the script is loaded and the call retried once. Scripts run
atomically, so "check the owner, then act" can never be split by another client (recipes R5, R6
of ``lock-recipes.md``). All keys of one lock share a hash tag, including the per-waiter wake-up
keys the scripts build from ``wake_prefix``, so they work on Redis Cluster.

The lease is a hash: ``token`` (the owner's random token), ``count`` (hold count, for
re-entrant locks), ``owner`` (JSON owner record for people), ``since`` (server time, ms), and
when used ``fence`` and ``nonce`` (makes a retried re-entry idempotent).

Waiting is first come, first served: a waiter that finds the lock taken appends its token to
the queue list, records a liveness deadline, and blocks (``BLPOP``) on its own wake-up list. A
release wakes exactly the queue head, and while the queue has a live head nobody else may take
the free lock (no barging, so no starvation). Waiters that die are skipped once their liveness
deadline passes; live waiters refresh it every time they look again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from .commands import (
    aexecute,
    aexecute_acknowledged,
    execute,
    execute_acknowledged,
    redirected,
    reread_slot_map,
    server_of,
)
from .durations import MAX_SECONDS

__all__ = [
    "ACQUIRE",
    "DURATION_CHECK",
    "EXTEND",
    "FORCE_RELEASE",
    "RAISE_FENCE",
    "RELEASE",
    "Script",
]

# Fencing counters are kept this long after the last acquisition (bounded memory: a name not
# locked for a day costs nothing). Tokens stay strictly increasing across that expiry because a
# new counter starts from the server clock in microseconds, which is past any earlier token.
FENCE_TTL_MS = 24 * 3600 * 1000


class Script:
    """A Lua script called by SHA, loaded on demand."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(
        self,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Any]] | None = None,
    ) -> Any:
        """Run the script (see :func:`execute` for ``reply_timeout`` and ``if_silent``)."""
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return execute(client, *command, reply_timeout=reply_timeout, if_silent=if_silent)
        except NoScriptError:
            execute(client, "SCRIPT", "LOAD", self.source, reply_timeout=reply_timeout)
            return execute(client, *command, reply_timeout=reply_timeout, if_silent=if_silent)

    def command(self, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The script as one command that needs nothing loaded (``EVAL`` of its source): for
        ``if_silent``, whose reply is never read, so a ``NOSCRIPT`` would go unseen."""
        return ("EVAL", self.source, len(keys), *keys, *args)

    def call_acknowledged(
        self, client: Any, keys: Sequence[str], args: Sequence[Any], replicas: int,
        timeout_ms: int, wanted: Callable[[Any], bool],
    ) -> tuple[Any, int]:  # fmt: skip
        """The script, then ``WAIT`` for ``replicas`` if ``wanted(reply)``: see
        :func:`execute_acknowledged`."""
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        server = server_of(client, keys[0])
        try:
            return self._acknowledged(server, command, replicas, timeout_ms, wanted)
        except (ResponseError, RedisConnectionError) as exc:
            if server is client or not (isinstance(exc, RedisConnectionError) or redirected(exc)):
                raise
            # This call (MOVED: the script did not run) or the next goes to the right primary.
            reread_slot_map(client)
            if isinstance(exc, RedisConnectionError):
                raise
            return self._acknowledged(
                server_of(client, keys[0]), command, replicas, timeout_ms, wanted
            )

    def _acknowledged(
        self, server: Any, command: Sequence[Any], replicas: int, timeout_ms: int,
        wanted: Callable[[Any], bool],
    ) -> tuple[Any, int]:  # fmt: skip
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

    async def acall(
        self,
        client: Any,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Any]] | None = None,
    ) -> Any:
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return await aexecute(
                client, *command, reply_timeout=reply_timeout, if_silent=if_silent
            )
        except NoScriptError:
            if hasattr(client, "connection_pool"):
                await aexecute(client, "SCRIPT", "LOAD", self.source, reply_timeout=reply_timeout)
            else:  # an asyncio Redis Cluster client: it loads the script on every primary
                await client.script_load(self.source)
            return await aexecute(
                client, *command, reply_timeout=reply_timeout, if_silent=if_silent
            )


# Every script that sets an expiry checks the milliseconds it is given first (Lua defining
# duration(value); prepend it), before anything is
# written: Lua does not roll back, so an expiry Redis refused after a write would leave a key of
# ours without one. (durations.py has checked them already; this is the last line.) Elsewhere,
# reads come before writes, and each key written gets its expiry before the next command that
# could fail.
DURATION_CHECK = (
    """
local function duration(value)
  local ms = tonumber(value)
  if not ms or ms < 1 or ms > """
    + str(MAX_SECONDS * 1000)
    + """ or ms % 1 ~= 0 then
    error('invalid duration: ' .. tostring(value) .. ' (whole milliseconds, at most a year)')
  end
  return ms
end
"""
)

# All scripts get the lease key as their one declared key and name its siblings from it (they
# share its hash tag, so its Cluster slot): fewer arguments to send and to unpack per call.
_SIBLINGS = """
local lease_key = KEYS[1]
local queue, deadlines = lease_key .. ':q', lease_key .. ':d'
local wake_prefix = lease_key .. ':w:'
local clock
local function now_ms()
  clock = clock or redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end
"""

# Skip waiters whose liveness deadline passed (they died or left without saying so), then
# wake the first live one. Used on release, and when a woken waiter leaves without the lock.
_WAKE_NEXT = """
local function wake_next()
  local head = redis.call('LINDEX', queue, 0)
  if not head then return end
  local now = now_ms()
  while head do
    local alive = tonumber(redis.call('HGET', deadlines, head) or '0')
    if alive >= now then
      local wake = wake_prefix .. head
      redis.call('RPUSH', wake, '1')
      redis.call('PEXPIRE', wake, alive - now + 1000)
      return
    end
    redis.call('LPOP', queue)
    redis.call('HDEL', deadlines, head)
    head = redis.call('LINDEX', queue, 0)
  end
end
"""

# The queue keys outlive every waiter's liveness deadline (at most _BLOCK_CAP + slack = 3 s).
QUEUE_TTL_MS = 5000

# KEYS: lease
# ARGV: token, lease_ms, owner_json, mode, flags, liveness_ms, nonce
#   mode 0: try once; 1: on failure join (or stay in) the queue; 2: on failure leave the queue;
#   3: leave the queue without trying
#   flags: 'f' fencing, 'r' re-entrant, 'o' return the holder's owner record on failure,
#          'w' a wake-up may be left on our list (delete it when we take the lock),
#          'd' if the guarded work left a result (<lease>:r), return {2, result} instead
# Returns {1, fence} when held, {0, wait_hint_ms, owner_json|false[, since_ms]} when not,
# {2, result} with the 'd' flag when the guarded work is already done.
ACQUIRE = Script(
    "acquire",
    DURATION_CHECK
    + _SIBLINGS
    + _WAKE_NEXT
    + """
local token, mode, flags = ARGV[1], tonumber(ARGV[4]), ARGV[5]
local lease, liveness = duration(ARGV[2]), duration(ARGV[6])
local holder = redis.call('HGET', lease_key, 'token')

if mode == 3 then
  -- Leave the queue without the lock (the waiter was interrupted), passing the turn on.
  redis.call('LREM', queue, 0, token)
  redis.call('HDEL', deadlines, token)
  redis.call('DEL', wake_prefix .. token)
  if not holder then wake_next() end
  return {0, 0, false}
end

if string.find(flags, 'd', 1, true) then
  -- The work this lock guards may be done already (a duplicate submission): its result.
  local result = redis.call('GET', lease_key .. ':r')
  if result then
    if redis.call('LREM', queue, 0, token) > 0 then
      redis.call('HDEL', deadlines, token)
      redis.call('DEL', wake_prefix .. token)
      if not holder then wake_next() end  -- the next duplicate reads the result too
    end
    return {2, result}
  end
end

if holder == token then
  -- Ours already: a re-entry, or a retried request whose first attempt got through.
  if string.find(flags, 'r', 1, true) and redis.call('HGET', lease_key, 'nonce') ~= ARGV[7] then
    redis.call('HINCRBY', lease_key, 'count', 1)
    redis.call('HSET', lease_key, 'nonce', ARGV[7])
    if redis.call('PTTL', lease_key) < lease then redis.call('PEXPIRE', lease_key, lease) end
  end
  return {1, tonumber(redis.call('HGET', lease_key, 'fence') or '0')}
end

local wait_hint
if not holder then
  local head = redis.call('LINDEX', queue, 0)
  while head and head ~= token do
    if tonumber(redis.call('HGET', deadlines, head) or '0') >= now_ms() then break end
    redis.call('LPOP', queue)
    redis.call('HDEL', deadlines, head)
    head = redis.call('LINDEX', queue, 0)
  end
  if (not head) or head == token then
    local now = now_ms()
    local record = {'token', token, 'count', 1, 'owner', ARGV[3], 'since', now}
    local fence, fence_key = 0, lease_key .. ':f'
    if string.find(flags, 'f', 1, true) then
      local micros = now * 1000 + tonumber(clock[2]) % 1000
      fence = math.max(tonumber(redis.call('GET', fence_key) or '0') + 1, micros)
      fence = string.format('%.0f', fence)
      table.insert(record, 'fence')
      table.insert(record, fence)
    end
    if string.find(flags, 'r', 1, true) then
      table.insert(record, 'nonce')
      table.insert(record, ARGV[7])
    end
    redis.call('HSET', lease_key, unpack(record))
    redis.call('PEXPIRE', lease_key, lease)
    if fence ~= 0 then
      redis.call('SET', fence_key, fence, 'PX', """
    + str(FENCE_TTL_MS)
    + """)
    end
    if head then
      redis.call('LPOP', queue)
      redis.call('HDEL', deadlines, token)
      if string.find(flags, 'w', 1, true) then redis.call('DEL', wake_prefix .. token) end
    end
    return {1, tonumber(fence)}
  end
  -- Free, but a live waiter is ahead of us: it has been woken and is on its way.
  wait_hint = tonumber(redis.call('HGET', deadlines, head)) - now_ms()
else
  wait_hint = redis.call('PTTL', lease_key)
end

if mode == 1 then
  local joining = redis.call('HSET', deadlines, token, now_ms() + liveness) == 1
  redis.call('PEXPIRE', deadlines, """
    + str(QUEUE_TTL_MS)
    + """)
  if joining then redis.call('RPUSH', queue, token) end
  redis.call('PEXPIRE', queue, """
    + str(QUEUE_TTL_MS)
    + """)
elseif mode == 2 then
  redis.call('LREM', queue, 0, token)
  redis.call('HDEL', deadlines, token)
  redis.call('DEL', wake_prefix .. token)
  -- We may have been woken for a free lock we now decline: pass the turn on.
  if not holder then wake_next() end
end
if string.find(flags, 'o', 1, true) then
  local record = redis.call('HMGET', lease_key, 'owner', 'since')
  return {0, wait_hint, record[1], record[2]}
end
return {0, wait_hint, false}
""",
)

# KEYS: lease
# ARGV: token, nonce[, result, result_ttl_ms]
#   nonce: '0' for a lock that is not re-entrant; else one per release, the same when it is
#   retried, so that a retry of a release whose reply was lost does not take a second level
# Returns the hold count left (0: released), or -1 when the lease is not ours (or the key is
# not a lock at all).
RELEASE = Script(
    "release",
    DURATION_CHECK
    + _SIBLINGS
    + _WAKE_NEXT
    + """
if ARGV[3] then duration(ARGV[4]) end
local holder = redis.pcall('HGET', lease_key, 'token')
if holder ~= ARGV[1] then return -1 end
if ARGV[2] ~= '0' then
  local count = tonumber(redis.call('HGET', lease_key, 'count') or '1')
  if redis.call('HGET', lease_key, 'rnonce') == ARGV[2] then return count end  -- a retry
  if count > 1 then
    redis.call('HSET', lease_key, 'rnonce', ARGV[2])
    return redis.call('HINCRBY', lease_key, 'count', -1)
  end
end
-- The lease is deleted last: a script that stops half-way (a Cluster slot being migrated
-- away has siblings that are not here) leaves it held, so release() can be retried.
wake_next()
if ARGV[3] then
  -- The result of the guarded work, kept for duplicates: written before the lock is free, so
  -- no duplicate can slip in between.
  redis.call('SET', lease_key .. ':r', ARGV[3], 'PX', ARGV[4])
end
redis.call('DEL', lease_key)
return 0
""",
)

# KEYS: lease   ARGV: token, lease_ms
# Returns 1 when the lease now ends lease_ms from now, 0 when it is not ours (lost).
EXTEND = Script(
    "extend",
    DURATION_CHECK
    + """
local lease = duration(ARGV[2])
if redis.pcall('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], lease)
return 1
""",
)

# KEYS: lease   ARGV: token
# Deletes the lease whatever its hold count, only if it still has the token an operator saw.
# Returns 1 when deleted, 0 when the lease has another token (or is gone), -1 when the key is
# not a lock (another type of key in our namespace): nothing is touched.
FORCE_RELEASE = Script(
    "force_release",
    _SIBLINGS
    + _WAKE_NEXT
    + """
local holder = redis.pcall('HGET', lease_key, 'token')
if type(holder) == 'table' and holder.err then return -1 end
if holder ~= ARGV[1] then return 0 end
wake_next()  -- before the delete: see RELEASE
redis.call('DEL', lease_key)
return 1
""",
)

# KEYS: lease   ARGV: token, fence
# Quorum mode: lift this server's fencing counter (and the lease's token) to the fence the
# acquisition settled on, while we hold the lease here. Returns 0 when the lease is not ours.
RAISE_FENCE = Script(
    "raise_fence",
    """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local fence_key = KEYS[1] .. ':f'
if tonumber(redis.call('GET', fence_key) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', fence_key, ARGV[2], 'PX', """
    + str(FENCE_TTL_MS)
    + """)
end
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
return 1
""",
)
