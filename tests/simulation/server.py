"""The real redis-server as the simulation sees it: the engine's own scripts, on a simulated
clock; simulated time applied to the keys' expiries; and the whole state of our keys read after
every step, in one round trip.

Time. The scripts ask ``server_time()`` (``scripts.SERVER_TIME``); here it reads the clock key
of the script's hash tag (``sim:clock{tag}``), which the simulation sets. Expiries are Redis's
own, but slowed down :data:`SCALE` times: a simulated millisecond is 10 real seconds, so no key
ever expires by itself in real time, and real time passing between two steps (under a second)
never shows in a TTL read back. Every expiry written (``SET ... PX``, ``PEXPIRE``) is scaled up
and every ``PTTL`` read scaled down (rounded): in the scripts, by a ``redis`` that stands in for
Redis's in the scripts' prelude; in plain commands, by :func:`scaled`. After each step the
simulation gives every key its simulated time left exactly (:data:`OBSERVE`), minus the
simulated time that passed, and deletes those whose time ran out: that is a lease expiring,
applied at the point the schedule chose, never by a real sleep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import NoScriptError

from django_redis_lock.backends.base import SCRIPTS
from django_redis_lock.backends.scripts import Script, load_script

__all__ = [
    "CLOCK_PREFIX",
    "NAMESPACE",
    "SCALE",
    "KeyState",
    "Observed",
    "SimulatedServer",
    "scaled",
]

CLOCK_PREFIX = "sim:clock"
# The keys of ours the simulation watches (its locks' namespace).
NAMESPACE = "drl-sim:"
# Real milliseconds of expiry per simulated one.
SCALE = 10_000

# The scripts' clock in the simulation: the simulated time of the script's hash tag (its
# first key's), in µs, as the simulation last set it; and expiries slowed down SCALE times.
SIMULATED_CLOCK = f"""
local server = redis
local SCALE = {SCALE}
local function scaled_call(call, command, ...)
  local args = {{...}}
  local name = string.upper(command)
  if name == 'PTTL' then
    local ms = call(command, ...)
    if type(ms) ~= 'number' or ms < 0 then return ms end
    return math.max(1, math.floor(ms / SCALE + 0.5))
  elseif name == 'PEXPIRE' then
    args[2] = tonumber(args[2]) * SCALE
  elseif name == 'SET' then
    for i = 3, #args - 1 do
      if string.upper(tostring(args[i])) == 'PX' then
        args[i + 1] = tonumber(args[i + 1]) * SCALE
      end
    end
  end
  return call(command, unpack(args))
end
local redis = setmetatable({{
  call = function(...) return scaled_call(server.call, ...) end,
  pcall = function(...) return scaled_call(server.pcall, ...) end,
}}, {{__index = server}})
local function server_time()
  local key = KEYS[1]
  local open = string.find(key, '{{', 1, true)
  local close = open and string.find(key, '}}', open + 1, true)
  local tag = ''
  if close and close > open + 1 then tag = string.sub(key, open, close) end
  -- A name of its own tag (a guard's: hashed) reads the clock of the simulation's tag,
  -- on one server or a quorum's member (a Cluster's names all have the simulation's tag).
  local micros = tonumber(server.call('GET', '{CLOCK_PREFIX}' .. tag))
    or tonumber(server.call('GET', '{CLOCK_PREFIX}{{sim}}'))
  return math.floor(micros / 1000), micros
end"""

# After each step (and to move time): set the clocks, pop what arrived on the lists that
# parked clients block on, give every key of ours its simulated time left, less the simulated
# time that passed (deleting those whose time ran out), and return the state of all.
# ARGV[1]  the simulated time for the next step, µs
# ARGV[2]  how far simulated time moved since the last call, ms (0: it did not)
# ARGV[3]  the pattern of our keys
# ARGV[4...] the wake-up lists to pop, one element each
# Returns, JSON-encoded (one string to decode instead of nested replies to parse, the most
# of a step's Python time): [popped (false: nothing), expired keys,
# [key, simulated pttl, type, value]...]; an empty array comes back as {} (cjson's way).
OBSERVE = f"""
local now, moved = ARGV[1], tonumber(ARGV[2])
for _, key in ipairs(redis.call('KEYS', '{CLOCK_PREFIX}*')) do
  redis.call('SET', key, now, 'KEEPTTL')
end
-- (Only keys that are here: a cluster node whose slot is moving may not touch the others.)
local here = {{}}
for _, key in ipairs(redis.call('KEYS', ARGV[3])) do here[key] = true end
local popped = {{}}
for i = 4, #ARGV do
  popped[#popped + 1] = here[ARGV[i]] and redis.call('LPOP', ARGV[i]) or false
end
local expired, state = {{}}, {{}}
for _, key in ipairs(redis.call('KEYS', ARGV[3])) do
  local pttl = redis.call('PTTL', key)
  if pttl > 0 then
    pttl = math.floor(pttl / {SCALE} + 0.5) - moved
    if pttl <= 0 then
      redis.call('DEL', key)
      expired[#expired + 1] = key
      pttl = -2
    else
      redis.call('PEXPIRE', key, pttl * {SCALE})
    end
  end
  if pttl ~= -2 then
    local kind = redis.call('TYPE', key)['ok']
    local value = false
    if kind == 'string' then value = redis.call('GET', key)
    elseif kind == 'list' then value = redis.call('LRANGE', key, 0, -1)
    elseif kind == 'hash' then value = redis.call('HGETALL', key)
    elseif kind == 'zset' then value = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    end
    state[#state + 1] = {{key, pttl, kind, value}}
  end
end
return cjson.encode({{popped, expired, state}})
"""


def scaled(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A plain command with its expiry slowed down as the scripts' are (``SET ... PX``,
    ``PEXPIRE``); a ``PTTL``'s reply is scaled back by the caller."""
    name = str(args[0]).upper()
    if name == "PEXPIRE":
        return (*args[:2], int(args[2]) * SCALE, *args[3:])
    if name == "SET":
        parts = list(args)
        for i in range(3, len(parts) - 1):
            if str(parts[i]).upper() == "PX":
                parts[i + 1] = int(parts[i + 1]) * SCALE
        return tuple(parts)
    return args


def unscaled_pttl(reply: Any) -> Any:
    """A real ``PTTL`` reply in simulated ms."""
    if isinstance(reply, int) and reply > 0:
        return max(1, (reply + SCALE // 2) // SCALE)
    return reply


@dataclass(slots=True)
class KeyState:
    pttl: int  # ms left (-1: no expiry)
    kind: str
    value: Any  # str, list[str], dict[str, str], or dict[str, float] (a sorted set)


@dataclass(slots=True)
class Observed:
    keys: dict[str, KeyState] = field(default_factory=dict)
    popped: list[str | None] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)

    def value(self, key: str) -> Any:
        state = self.keys.get(key)
        return None if state is None else state.value


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


def _array(value: Any) -> list[Any]:
    """A JSON array from ``cjson``, which encodes an empty one as ``{}``."""
    return value if isinstance(value, list) else []


def _decoded(kind: str, value: Any) -> Any:
    if kind == "list":
        return _array(value)
    if kind in ("hash", "zset"):
        pairs = _array(value)
        keys, values = pairs[0::2], pairs[1::2]
        if kind == "zset":
            return dict(zip(keys, (float(v) for v in values), strict=True))
        return dict(zip(keys, values, strict=True))
    return value


class SimulatedServer:
    """One real redis-server, run on simulated time (see the module's docstring)."""

    def __init__(self, url: str, scripts: dict[str, Script] | None = None) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url)
        self.scripts = scripts if scripts is not None else simulated_scripts()
        self.observer = self.client.register_script(OBSERVE)
        self.connection = self.client.connection_pool.get_connection()
        self._observed_args: list[Any] = []
        # The node imports the slot being moved (Redis Cluster): each call says ASKING first.
        self.asking = False

    def reset(self) -> None:
        """Empty the database for a new schedule."""
        self.client.flushdb()

    # The observation in two halves, so that a world sends it to every node before it reads
    # any answer (the nodes work at once). On a connection of its own, held for the server's
    # life: redis-py's Connection, without the client's per-command work (a schedule observes
    # a few hundred times; this was most of a step's cost).

    def send_observe(self, now_us: int, moved_ms: int, pops: list[str]) -> None:
        self._observed_args = [now_us, moved_ms, NAMESPACE + "*", *pops]
        self._send_observe("EVALSHA", self.observer.sha)

    def _send_observe(self, command: str, script: str) -> None:
        if self.asking:  # (the node imports the slot being moved: its keys need ASKING)
            self.connection.send_command("ASKING")
        self.connection.send_command(command, script, 0, *self._observed_args)

    def read_observe(self) -> Observed:
        if self.asking:
            self.connection.read_response()
        try:
            encoded = self.connection.read_response()
        except NoScriptError:  # flushed by a simulated restart: sent whole once more
            self._send_observe("EVAL", OBSERVE)
            return self.read_observe()
        popped, expired, state = json.loads(encoded)
        observed = Observed(
            popped=[None if item is False else item for item in _array(popped)],
            expired=_array(expired),
        )
        for key, pttl, kind, value in _array(state):
            observed.keys[key] = KeyState(int(pttl), kind, _decoded(kind, value))
        return observed

    # -- faults on the server ------------------------------------------------------------------

    def snapshot(self) -> dict[str, bytes]:
        """Every key of ours, as ``DUMP`` gives it (its TTL is kept by the caller)."""
        keys = self.client.keys(NAMESPACE + "*")
        dumps = self.client.pipeline(transaction=False)
        for key in keys:
            dumps.dump(key)
        return {_text(key): dump for key, dump in zip(keys, dumps.execute(), strict=True)}

    def restart(self, snapshot: dict[str, tuple[bytes, int]] | None) -> None:
        """A restart that lost the data written since ``snapshot`` (key -> dump and simulated
        ms left now), or all of it (None). Scripts are flushed, as a restart forgets them."""
        deletes = self.client.pipeline(transaction=False)
        for key in self.client.keys(NAMESPACE + "*"):  # (one by one: a Cluster node's keys
            deletes.delete(key)  # are of several slots, which one DEL may not touch)
        deletes.execute()
        for key, (dump, ms) in (snapshot or {}).items():
            self.client.restore(key, ms * SCALE, dump)
        self.client.script_flush()

    def close(self) -> None:
        self.client.connection_pool.release(self.connection)
        self.client.close()


def simulated_scripts(patch: Any = None) -> dict[str, Script]:
    """The engine's scripts on the simulated clock; ``patch(name, source) -> source`` changes
    a script's source first (a deliberate mutation, ``mutations.py``)."""
    scripts: dict[str, Script] = {}
    for name in SCRIPTS:  # the engine's, as the backends know them
        script = load_script(name, server_time=SIMULATED_CLOCK)
        if patch is not None:
            source = patch(name, script.source)
            if source != script.source:
                script = Script(name, source)
        scripts[name] = script
    return scripts
