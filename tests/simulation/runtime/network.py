"""The network between the library's connections and the real servers, in the schedule's hands.

``connection.py``'s ``SimulatedConnection`` is a redis-py ``Connection`` (a pool makes it from
``connection_class``, as ``CONNECTION_POOL_KWARGS`` in ``CACHES`` says) with no socket: what
the library sends on it becomes a :class:`Link`'s outbound commands, and what it reads waits
(``threads.Wait``) for the replies the scheduler hands it. The scheduler (``simulation.py``)
decides when each command reaches its server (:meth:`Network.deliver`: links are served in any
order, each in its own order, as TCP does), when a reply arrives, and which links are cut
(:meth:`Network.cut`: commands not yet delivered are lost, replies not yet read too).

What the servers run is what the library sent, with the simulation's three changes
(``server.py``): the scripts are their simulated twins (the same text with the simulated clock,
or a deliberate mutation), found by the real script's SHA or text; expiries are scaled; and
``TIME`` answers simulated time. A ``BLPOP`` that finds its list empty parks at its server
(:class:`Parked`), as Redis parks a blocked client: the observation after each step pops for
it (first parked, first served), and its time runs out on the simulated clock.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_redis_lock.backends import scripts
from django_redis_lock.backends.scripts import SERVER_TIME, Script
from django_redis_lock.guards import replays

from ..server import SCALE, SIMULATED_CLOCK
from .threads import Crashed, Wait, current_actor

__all__ = [
    "Link", "Network", "Parked", "current", "current_or_none", "install", "packed",
    "parse_commands",
]  # fmt: skip

SCRIPT_NAMES = (
    "take", "take_many", "join", "release", "extend", "extend_many",
    "permit_acquire", "permit_release", "permit_extend", "wake",
    "charge_replay",  # (the guards': the budgets of kept responses)
)  # fmt: skip

# Sent by redis-py on a connection of its own accord, answered here (no server step).
_LOCAL = {b"CLIENT", b"HELLO", b"PING", b"SELECT", b"AUTH", b"READONLY"}


def _micros(seconds: float) -> int:
    """A wait of ``seconds`` in the simulated clock's microseconds: never 0 (real time moves
    on while one waits: a wait that ended at once would loop for ever at one instant)."""
    return max(1, math.ceil(seconds * 1e6))


def packed(command: Any) -> bytes:
    """What ``send_packed_command`` was given, as one write's bytes."""
    if isinstance(command, bytes | bytearray):
        return bytes(command)
    return b"".join(bytes(part) for part in ([command] if isinstance(command, str) else command))


def parse_commands(data: bytes) -> list[list[bytes]]:
    """The commands in ``data``: RESP arrays of bulk strings, as redis-py and ``wire.pack``
    write them."""
    commands: list[list[bytes]] = []
    at = 0
    while at < len(data):
        assert data[at : at + 1] == b"*", data[at : at + 20]
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        args: list[bytes] = []
        for _ in range(count):
            end = data.index(b"\r\n", at)
            size = int(data[at + 1 : end])
            args.append(data[end + 2 : end + 2 + size])
            at = end + 2 + size + 2
        commands.append(args)
    return commands


@dataclass(eq=False)
class Parked:
    """A ``BLPOP`` blocked at its server: on ``key``, until ``until_us`` (None: for ever)."""

    key: str
    until_us: int | None


@dataclass(eq=False)
class Link:
    """One connection between a client's process and a server."""

    number: int
    network: Network
    node: Any  # the world's SimulatedServer
    process: Any
    # What it sent and its server has not run yet: one packet (one write) at a time, which
    # Redis runs at once, as it runs every command it reads in one go.
    outbound: deque[list[list[bytes]]] = field(default_factory=deque)
    replies: deque[Any] = field(default_factory=deque)
    parked: Parked | None = None
    dead: bool = False  # cut: nothing more goes either way
    closed: bool = False  # closed by its client: what it sent still arrives, nothing comes back
    slow_until_us: int = 0  # its replies are held back until then (a slow network, a slow server)
    late_until_us: int = 0  # what it sends is held back until then (a slow network on the way)
    reader: Any = None  # the actor waiting for its reply

    def readable(self, now_us: int) -> bool:
        return (bool(self.replies) and self.slow_until_us <= now_us) or self.dead

    def __repr__(self) -> str:
        return f"link{self.number}"


class Network:
    """Every link of a schedule, and how a command is carried out at its server."""

    def __init__(self, world: Any, scheduler: Any, patch: Any = None) -> None:
        self.world = world
        self.scheduler = scheduler
        self.links: list[Link] = []
        self._numbers = itertools.count(1)
        self.by_sha, self.by_source = _twins(patch)
        self.trace: Any = None  # (simulation.py's, for what each step did)

    # -- the clients' side (in an actor's thread) ------------------------------------------------

    def process_now(self) -> Any:
        """The simulated process whose thread runs now."""
        actor = current_actor()
        return actor.process if actor is not None else None

    def open(self, host: str, port: int) -> Link:
        process = self.process_now()
        if process is not None and process.crashed:
            raise Crashed()
        link = Link(next(self._numbers), self, self.world.node_at(host, port), process)
        self.links.append(link)
        return link

    def link_for(self, link: Link | None, host: str, port: int) -> Link:
        """The link a connection that holds ``link`` (None: none yet) is to use now: that one,
        unless it is an earlier schedule's, or another simulated process's (they share the
        real process's pools: a connection another process opened is not this one's, and its
        crash cuts it), then a new one."""
        if link is not None and link.network is self and link.process is self.process_now():
            return link
        if link is not None and link.network is self:
            self.close(link)
        return self.open(host, port)

    def send(self, link: Link, data: bytes) -> None:
        if link.process is not None and link.process.crashed:
            raise Crashed()
        if link.dead or link.closed:
            raise RedisConnectionError("simulated: the connection was cut")
        link.outbound.append(parse_commands(data))

    def read(self, link: Link, timeout: float | None) -> Any:
        """The next reply on ``link``, waiting for it up to ``timeout`` simulated seconds."""
        if not link.readable(self.scheduler.now_us):
            now = self.scheduler.now_us
            until = None if timeout is None else now + _micros(timeout)
            actor = current_actor()
            if actor is None:
                raise RuntimeError("a simulated connection read outside a simulated thread")
            link.reader = actor
            try:
                actor.block(Wait(until_us=until, link=link))
            finally:
                link.reader = None
        if link.readable(self.scheduler.now_us) and link.replies:
            return link.replies.popleft()
        if link.dead:
            raise RedisConnectionError("simulated: the connection was cut")
        raise RedisTimeoutError("simulated: no reply in time")

    def readable(self, link: Link, timeout: float) -> bool:
        if link.readable(self.scheduler.now_us) or not timeout:
            return link.readable(self.scheduler.now_us)
        actor = current_actor()
        assert actor is not None
        link.reader = actor
        try:
            actor.block(Wait(until_us=self.scheduler.now_us + _micros(timeout), link=link))
        finally:
            link.reader = None
        return link.readable(self.scheduler.now_us)

    def close(self, link: Link) -> None:
        """The client closed ``link``: what it sent still reaches the server (then the server
        sees it close), no reply is read any more; a ``BLPOP`` parked on it unblocks (nothing
        is popped for it from now on)."""
        link.closed = True
        link.replies.clear()
        link.parked = None

    # -- the scheduler's side --------------------------------------------------------------------

    def deliverable(self) -> list[Link]:
        now = self.scheduler.now_us
        return [
            link for link in self.links
            if link.outbound and not link.dead and link.late_until_us <= now
        ]  # fmt: skip

    def late(self) -> list[Link]:
        """The links whose requests are held back on the way (``late_until_us``)."""
        now = self.scheduler.now_us
        return [link for link in self.links if link.outbound and link.late_until_us > now]

    def parked(self) -> list[Link]:
        return [link for link in self.links if link.parked is not None and not link.dead]

    def slow(self, now_us: int) -> list[Link]:
        return [link for link in self.links if link.slow_until_us > now_us and link.replies]

    def deliver(self, link: Link) -> list[list[bytes]]:
        """The first packet ``link`` sent reaches its server and runs; the replies wait on the
        link (a parked ``BLPOP``'s, later)."""
        packet = link.outbound.popleft()
        for command in packet:
            self._deliver(link, command)
        return packet

    def _deliver(self, link: Link, command: list[bytes]) -> None:
        name = command[0].upper()
        if link.closed:  # (run, its reply read by nobody)
            if name not in _LOCAL and name not in (b"TIME", b"BLPOP"):
                self._run(link.node, command)
            return
        if name in _LOCAL:
            link.replies.append(b"OK" if name != b"PING" else b"PONG")
        elif name == b"TIME":
            now = self.scheduler.now_us
            link.replies.append([b"%d" % (now // 1_000_000), b"%d" % (now % 1_000_000)])
        elif name == b"BLPOP":
            self._blpop(link, command)
        else:
            link.replies.append(self._run(link.node, command))

    def _blpop(self, link: Link, command: list[bytes]) -> None:
        key, seconds = command[1].decode(), float(command[-1])
        popped = self._run(link.node, [b"LPOP", command[1]])
        if popped is not None and not isinstance(popped, ResponseError):
            link.replies.append([command[1], popped])
            return
        until = None if seconds == 0 else self.scheduler.now_us + round(seconds * 1e6)
        link.parked = Parked(key, until)

    def woken(self, link: Link, popped: bytes | None) -> None:
        """The parked ``BLPOP`` on ``link`` ends: ``popped`` for it, or its time ran out."""
        assert link.parked is not None
        key, link.parked = link.parked.key, None
        link.replies.append(None if popped is None else [key.encode(), popped])

    def cut(self, link: Link) -> None:
        """The connection breaks: what it had not delivered is lost, and its replies too."""
        link.dead = True
        link.outbound.clear()
        link.replies.clear()
        link.parked = None

    def _run(self, node: Any, command: Sequence[bytes]) -> Any:
        name = command[0].upper()
        args: list[Any] = list(command)
        if name == b"EVALSHA":
            args[1] = self._twin(self.by_sha, args[1]).sha
        elif name == b"EVAL":
            args[1] = self._twin(self.by_source, args[1]).source
        elif name == b"SCRIPT" and args[1].upper() == b"LOAD":
            script = self._twin(self.by_source, args[2])
            reply = self._raw(node, [b"SCRIPT", b"LOAD", script.source])
            if isinstance(reply, ResponseError):
                return reply
            return library_script(script.name).sha.encode()
        elif name == b"PEXPIRE":
            args[2] = int(args[2]) * SCALE
        elif name == b"SET":
            for i in range(3, len(args) - 1):
                if args[i].upper() == b"PX":
                    args[i + 1] = int(args[i + 1]) * SCALE
                elif args[i].upper() == b"EX":
                    args[i] = b"PX"
                    args[i + 1] = int(args[i + 1]) * 1000 * SCALE
        reply = self._raw(node, args)
        if name == b"PTTL" and isinstance(reply, int) and reply > 0:
            return max(1, (reply + SCALE // 2) // SCALE)
        return reply

    @staticmethod
    def _twin(table: dict[bytes, Script], key: Any) -> Script:
        """The simulated twin of a script the library sent (a real one run on the server would
        read the server's clock, not the simulated one)."""
        script = table.get(bytes(key))
        if script is None:
            raise AssertionError(
                f"the library sent a script the simulation does not know: {key!r}"
            )
        return script

    @staticmethod
    def _raw(node: Any, args: Sequence[Any]) -> Any:
        connection = node.connection
        connection.send_command(*args)
        try:
            return connection.read_response()
        except ResponseError as error:
            return error


def library_script(name: str) -> Script:
    """The library's script ``name``, as it sends it."""
    return replays.CHARGE if name == "charge_replay" else getattr(scripts, name.upper())


def _twins(patch: Any) -> tuple[dict[bytes, Script], dict[bytes, Script]]:
    """The simulated twin of each script the library loaded (by its SHA, by its text): its
    own text with the simulated clock, and ``patch`` applied. Made from the scripts in memory,
    never read again from their files: an edit during a campaign must not split the two."""
    by_sha: dict[bytes, Script] = {}
    by_source: dict[bytes, Script] = {}
    for name in SCRIPT_NAMES:
        real = library_script(name)
        source = real.source.replace(SERVER_TIME.strip(), SIMULATED_CLOCK.strip(), 1)
        assert source != real.source, f"{name}.lua: its clock is not where it was"
        simulated = _simulated(name, source)
        if patch is not None:
            patched = patch(name, source)
            if patched != source:
                simulated = Script(name, patched)
        by_sha[real.sha.encode()] = simulated
        by_source[real.source.encode()] = simulated
    return by_sha, by_source


@functools.cache
def _simulated(name: str, source: str) -> Script:
    return Script(name, source)


_network: Network | None = None


def install(network: Network | None) -> None:
    """The network the simulated connections made from now on use (None: none)."""
    global _network
    _network = network


def current() -> Network:
    """The network of the schedule that runs now."""
    if _network is None:
        raise RedisConnectionError("simulated: no simulation is running")
    return _network


def current_or_none() -> Network | None:
    return _network
