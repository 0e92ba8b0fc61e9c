"""The Lua scripts of the lock engine, and how they are called.

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

import asyncio
import contextlib
import functools
import hashlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, cast

from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .durations import MAX_SECONDS

__all__ = [
    "ACQUIRE",
    "DURATION_CHECK",
    "EXTEND",
    "FORCE_RELEASE",
    "RAISE_FENCE",
    "RELEASE",
    "Script",
    "adrop_stale_connections",
    "aexecute",
    "await_wake",
    "drop_stale_connections",
    "execute",
    "execute_many",
    "follow_sentinel",
    "request_sent",
    "reread_slot_map",
    "wait_for_wake",
]

# Fencing counters are kept this long after the last acquisition (bounded memory: a name not
# locked for a day costs nothing). Tokens stay strictly increasing across that expiry because a
# new counter starts from the server clock in microseconds, which is past any earlier token.
FENCE_TTL_MS = 24 * 3600 * 1000


def _pack(args: Sequence[Any]) -> bytes:
    """One command in RESP. Ours are made of str, bytes and int only, and packing them here is
    several times cheaper than redis-py's general-purpose packer, on the hottest path we have."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode("utf-8", "surrogatepass")
        elif isinstance(arg, int):
            arg = b"%d" % arg
        elif isinstance(arg, float):
            arg = repr(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def request_sent(error: BaseException) -> bool:
    """Whether a request that failed with ``error`` may have run in Redis all the same: False
    for an error reply, and for a connection that could not be made (nothing was sent)."""
    return not isinstance(error, ResponseError) and getattr(error, "request_sent", True)


def _unsent(error: RedisError) -> None:
    error.request_sent = False  # type: ignore[attr-defined]


@contextlib.contextmanager
def _borrowed(client: Any) -> Iterator[Any]:
    """A connection of ``client``'s pool for a few commands, given back afterwards."""
    pool = client.connection_pool
    try:
        connection = pool.get_connection()
    except RedisError as error:
        _unsent(error)
        raise
    try:
        yield connection
    except ResponseError:
        raise  # a complete error reply: the connection is still in step
    except BaseException:
        # Timeout, dropped connection, or an interrupt in the middle of a blocking command:
        # a reply may still be on its way, so this connection must not be reused.
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


@contextlib.asynccontextmanager
async def _aborrowed(client: Any) -> AsyncIterator[Any]:
    """:func:`_borrowed` for a ``redis.asyncio`` client."""
    pool = client.connection_pool
    try:
        connection = await pool.get_connection()
    except RedisError as error:
        _unsent(error)
        raise
    try:
        yield connection
    except ResponseError:
        raise
    except BaseException:
        await connection.disconnect()
        raise
    finally:
        await pool.release(connection)


def _sooner(reply_timeout: float | None, socket_timeout: float | None) -> bool:
    """Whether ``reply_timeout`` cuts a wait for a reply shorter than the socket timeout."""
    return reply_timeout is not None and (socket_timeout is None or reply_timeout < socket_timeout)


def _socket_timeout(pool: Any) -> float | None:
    """The socket timeout a pool's connections get: configured, or their class's default."""
    kwargs = pool.connection_kwargs
    if "socket_timeout" in kwargs:
        return cast("float | None", kwargs["socket_timeout"])
    return _default_socket_timeout(pool.connection_class)


@functools.cache
def _default_socket_timeout(connection_class: type) -> float | None:
    # redis-py 8.1 gives connections a 5 s default; earlier versions none (None).
    for klass in connection_class.__mro__:
        init = klass.__dict__.get("__init__")
        parameter = inspect.signature(init).parameters.get("socket_timeout") if init else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return cast("float | None", parameter.default)
    return None


def _no_reply(reply_timeout: float) -> RedisTimeoutError:
    return RedisTimeoutError(f"Redis did not answer within {reply_timeout:.3g}s")


def execute(
    client: Any,
    *args: Any,
    reply_timeout: float | None = None,
    if_silent: Callable[[], Sequence[Any]] | None = None,
) -> Any:
    """Send one command on a connection of ``client``'s pool, once, and return the raw reply.

    Not ``client.execute_command``: that retries on timeouts and connection errors (redis-py 8
    by default ten times, with back-off), which would turn "Redis is unreachable" into a long
    hang, and could run a lock script twice (a re-entry counted twice). A lock operation is
    tried once; the caller decides what a failure means.

    ``reply_timeout``: raise ``TimeoutError`` (and drop the connection) when no reply came
    within that many seconds, if that is sooner than the socket timeout (one server or
    Sentinel; a Cluster client keeps its socket timeout). ``if_silent``: makes a command to send
    after the first on the same connection, without waiting for its reply, when no reply
    came in time: Redis runs it after the first, whenever it runs that one.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        key = _routing_key(args) if hasattr(client, "get_node_from_key") else None
        if key is None:  # a QuorumClient, or SCRIPT LOAD on every primary of a Cluster
            return client.execute_command(*args)
        # Redis Cluster: with its node named, redis-py sends the command once (still following
        # MOVED and ASK, which mean it did not run) instead of retrying it after a timeout or
        # a dropped connection, when it may have run.
        return client.execute_command(*args, target_nodes=client.get_node_from_key(key))
    with _borrowed(client) as connection:
        connection.send_packed_command([_pack(args)])
        try:
            if (
                reply_timeout is not None
                and _sooner(reply_timeout, connection.socket_timeout)
                and not connection.can_read(timeout=reply_timeout)
            ):
                raise _no_reply(reply_timeout)
            if if_silent is None:
                return connection.read_response()
            # Left open on a timeout, for if_silent to follow on it (then dropped, by _borrowed).
            return connection.read_response(disconnect_on_error=False)
        except RedisTimeoutError:
            if if_silent is not None:  # still open and in step: it runs after the first
                with contextlib.suppress(RedisError, OSError):
                    connection.send_packed_command([_pack(if_silent())], check_health=False)
            raise


def _routing_key(args: Sequence[Any]) -> Any:
    """The key a command of ours is routed by on a Redis Cluster (None: no key)."""
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        return args[3] if int(args[2]) else None
    return args[1] if name != "SCRIPT" and len(args) > 1 else None


def _server_of(client: Any, key: str) -> Any:
    """The plain client of the server that holds ``key``: ``client`` itself, or for a Redis
    Cluster client the current primary of the key's slot (``WAIT`` must follow the write on the
    same connection, which the cluster client's own routing does not promise)."""
    if hasattr(client, "connection_pool"):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


def follow_sentinel(pool: Any) -> bool:
    """For a Sentinel pool (False for any other): ask Sentinel where the primary is now. If it
    moved, redis-py drops the pool's idle connections to the old one, and closes the others
    when they come back."""
    ask = getattr(pool, "get_master_address", None)
    if ask is None:
        return False
    with contextlib.suppress(RedisError):
        ask()
    return True


def reread_slot_map(cluster: Any) -> None:
    """A Redis Cluster client whose slot moved or whose primary failed: read the slot map
    again, so that the next call goes to the slot's owner now."""
    with contextlib.suppress(RedisError, RedisClusterException):
        cluster.nodes_manager.initialize()


def drop_stale_connections(client: Any, key: str) -> None:
    """After a write no replica confirmed: the server may be a primary that a failover has
    replaced. Find out where the primary is now and drop the idle connections to the old one.

    Idle ones only: another thread may be blocked on one of the others (a waiter); a Sentinel
    pool closes those when they come back, once it knows the new primary's address.
    """
    pool = _server_of(client, key).connection_pool
    if not follow_sentinel(pool):
        pool.disconnect(inuse_connections=False)
    if not hasattr(client, "connection_pool"):
        reread_slot_map(client)


async def adrop_stale_connections(client: Any) -> None:
    """:func:`drop_stale_connections` for a ``redis.asyncio`` client (not a Cluster)."""
    pool = client.connection_pool
    if hasattr(pool, "get_master_address"):
        with contextlib.suppress(RedisError):
            await pool.get_master_address()
    else:
        await pool.disconnect(inuse_connections=False)


def execute_acknowledged(
    client: Any,
    command: Sequence[Any],
    replicas: int,
    timeout_ms: int,
    wanted: Callable[[Any], bool],
) -> tuple[Any, int]:
    """:func:`execute`, then, if ``wanted(reply)``, ``WAIT replicas timeout_ms`` on the same
    connection (``WAIT`` counts the replicas that have this connection's writes). Returns the
    reply and the number of replicas that acknowledged (-1 when not asked)."""
    with _borrowed(client) as connection:
        connection.send_packed_command([_pack(command)])
        reply = connection.read_response()
        acknowledged = -1
        if wanted(reply):
            connection.send_packed_command([_pack(("WAIT", replicas, timeout_ms))])
            acknowledged = int(connection.read_response())
        return reply, acknowledged


async def aexecute_acknowledged(
    client: Any,
    command: Sequence[Any],
    replicas: int,
    timeout_ms: int,
    wanted: Callable[[Any], bool],
) -> tuple[Any, int]:
    """:func:`execute_acknowledged` for a ``redis.asyncio`` client."""
    async with _aborrowed(client) as connection:
        await connection.send_packed_command([_pack(command)])
        reply = await connection.read_response()
        acknowledged = -1
        if wanted(reply):
            await connection.send_packed_command([_pack(("WAIT", replicas, timeout_ms))])
            acknowledged = int(await connection.read_response())
        return reply, acknowledged


def execute_many(client: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Send several commands in one round trip (a pipeline without MULTI), each once.

    Error replies are returned in place, as exception instances, not raised.
    """
    replies = []
    with _borrowed(client) as connection:
        connection.send_packed_command([b"".join(_pack(command) for command in commands)])
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except ResponseError as error:  # a complete error reply: still in step
                replies.append(error)
    return replies


# BLPOP's own timeout is only checked when the server's event loop wakes (every 100 ms on an
# idle server with the default hz 10), so it can overshoot by that much. When the time matters
# (the wait ends, or the holder's lease does) the server is given longer and the client cuts the
# wait itself, to the millisecond, at the price of a new connection next time. Otherwise the
# server's timeout is used and the client allows it this much lateness.
_SERVER_LATENESS = 0.5


def _blpop_timeouts(seconds: float, exact: bool) -> tuple[float, float]:
    """(timeout sent to the server, time the client waits for the reply)."""
    if exact:
        return seconds + 1.0, seconds
    return seconds, seconds + _SERVER_LATENESS


def _interrupted(error: RedisError) -> bool:
    """A blocked wait that ended because the server went away or changed role: a failover
    (Redis Cluster answers ``-UNBLOCKED`` to clients blocked on a primary that became a
    replica, or ``MOVED``; Sentinel's demotion closes the connection), not a bad request."""
    if isinstance(error, RedisConnectionError | RedisTimeoutError) or _redirected(error):
        return True
    return isinstance(error, ResponseError) and str(error).startswith("UNBLOCKED")


def _redirected(error: RedisError) -> bool:
    """``MOVED`` or ``ASK``: redis-py before 6 raises them as plain ``ResponseError`` outside
    its Cluster client."""
    return isinstance(error, MovedError | AskError) or (
        isinstance(error, ResponseError) and str(error).startswith(("MOVED ", "ASK "))
    )


def wait_for_wake(client: Any, key: str, seconds: float, *, exact: bool = True) -> bool:
    """Block until something is pushed on ``key`` (True) or ``seconds`` pass (False).

    A wait interrupted by a failover also returns False: the caller asks the lock again,
    which fails at once if no primary answers, or goes on waiting on the new one.
    """
    if not hasattr(client, "connection_pool"):
        if not hasattr(client, "get_node_from_key"):  # quorum mode: see quorum.py
            return execute(client, "BLPOP", key, seconds) is not None
        cluster, client = client, _server_of(client, key)  # timed here, on the node's own pool
    else:
        cluster = None
    server_timeout, client_timeout = _blpop_timeouts(seconds, exact)
    try:
        with _borrowed(client) as connection:
            connection.send_packed_command([_pack(("BLPOP", key, server_timeout))])
            if connection.can_read(timeout=client_timeout):
                return connection.read_response() is not None
            # Still blocked server-side: drop the connection rather than wait for the reply. A
            # wake-up popped just now is not lost: the caller asks the queue again either way.
            connection.disconnect()
            return False
    except RedisError as error:
        if not _interrupted(error):
            raise
        if cluster is not None:
            reread_slot_map(cluster)
        return False


async def await_wake(client: Any, key: str, seconds: float, *, exact: bool = True) -> bool:
    """:func:`wait_for_wake` for a ``redis.asyncio`` client."""
    if not hasattr(client, "connection_pool"):  # Redis Cluster, or quorum mode (quorum.py)
        try:
            return await aexecute(client, "BLPOP", key, seconds) is not None
        except RedisError as error:
            if not _interrupted(error):
                raise
            return False
    server_timeout, client_timeout = _blpop_timeouts(seconds, exact)
    try:
        async with _aborrowed(client) as connection:
            await connection.send_packed_command([_pack(("BLPOP", key, server_timeout))])
            try:
                reply = await asyncio.wait_for(connection.read_response(), client_timeout)
            except asyncio.TimeoutError:
                await connection.disconnect()
                return False
            return reply is not None
    except RedisError as error:
        if not _interrupted(error):
            raise
        return False


async def aexecute(
    client: Any,
    *args: Any,
    reply_timeout: float | None = None,
    if_silent: Callable[[], Sequence[Any]] | None = None,
) -> Any:
    """:func:`execute` for a ``redis.asyncio`` client; ``if_silent`` is also sent when the
    task is cancelled while it waits for the reply."""
    if not hasattr(client, "connection_pool"):  # Redis Cluster, or quorum mode (quorum.py)
        key = _routing_key(args) if hasattr(client, "get_node_from_key") else None
        if key is None:
            return await client.execute_command(*args)
        # Named node: sent once, MOVED and ASK still followed (see execute()). The asyncio
        # client reads the slot map on first use, not when built.
        await client.initialize()
        return await client.execute_command(*args, target_nodes=client.get_node_from_key(key))
    if not _sooner(reply_timeout, _socket_timeout(client.connection_pool)):
        return await _aexecute_once(client, args, if_silent)
    try:  # the whole exchange: a new connection's handshake waits for Redis too
        return await asyncio.wait_for(_aexecute_once(client, args, if_silent), reply_timeout)
    except asyncio.TimeoutError:
        raise _no_reply(cast(float, reply_timeout)) from None


async def _aexecute_once(
    client: Any, args: Sequence[Any], if_silent: Callable[[], Sequence[Any]] | None = None
) -> Any:
    async with _aborrowed(client) as connection:
        await connection.send_packed_command([_pack(args)])
        if if_silent is None:
            return await connection.read_response()
        try:
            # Left open when cancelled or timed out, for if_silent to follow on it.
            return await connection.read_response(disconnect_on_error=False)
        except (asyncio.CancelledError, RedisTimeoutError):
            with contextlib.suppress(RedisError, OSError, asyncio.CancelledError):
                await connection.send_packed_command([_pack(if_silent())], check_health=False)
            raise


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
        server = _server_of(client, keys[0])
        try:
            return self._acknowledged(server, command, replicas, timeout_ms, wanted)
        except (ResponseError, RedisConnectionError) as exc:
            if server is client or not (isinstance(exc, RedisConnectionError) or _redirected(exc)):
                raise
            # This call (MOVED: the script did not run) or the next goes to the right primary.
            reread_slot_map(client)
            if isinstance(exc, RedisConnectionError):
                raise
            return self._acknowledged(
                _server_of(client, keys[0]), command, replicas, timeout_ms, wanted
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
