"""Quorum mode: one lock on several independent Redis servers, held while a majority holds it.

    DJANGO_REDIS_LOCK_QUORUMS = {"redlock": ["locks-a", "locks-b", "locks-c"]}   # cache aliases
    Lock("payments:42", using="redlock")          # or Lock(..., using=["locks-a", ...])

This is the Redlock algorithm. Each server runs the same scripts as in single-server mode;
:class:`QuorumClient` sends each script to every server at once and answers as the majority
does, so ``Lock``, the watchdog and the guards built on them have no quorum-specific code
beyond ``backends.QuorumBackend`` saying there is no queue:

- an acquisition counts when a majority granted it within the lease minus the time the requests
  took and a clock-drift allowance (measured on the monotonic clock). Otherwise the servers
  that granted it release it again, and the caller is told the lock is taken;
- a release or renewal goes to every server and counts when a majority confirms it; a renewal
  that a majority refuses is a loss (``lock_lost``);
- ``locked()``, ``owned()`` and ``ttl()`` answer what a majority says;
- when too few servers answer to decide either way, the operation raises
  :class:`QuorumUnavailable` (the ``Lock`` turns it into ``LockBackendError``), in at most the
  servers' socket timeout: a stopped server is one that refuses connections (immediate) or
  stays silent (the majority's answer is taken without it).

Waiting is where quorum mode differs. The first-come-first-served queue of single-server mode
does not compose across servers: each server would order the waiters its own way, and every
waiter could be first on one server and behind on the others, holding the lock nowhere. So
waiters look again after a short random delay (random, so that clients that split a free
lock's votes between them do not split them again in step), as Redlock prescribes. A release
does not wake them; the hand-over takes a delay of 5-30 ms more than in single-server mode.

Fencing tokens are the largest of the granting servers' clocks, in microseconds: strictly
increasing as long as the servers' clocks agree to within the time between two acquisitions
(a few milliseconds at least, since a waiter looks again after 5-30 ms); keep them in step with
NTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from .commands import pack
from .core.lease import LockKeys
from .durations import clock_allowance
from .scripts import EXTEND, RELEASE, TAKE, Script

__all__ = ["MIN_MEMBERS", "AsyncQuorumClient", "QuorumClient", "QuorumUnavailable", "members"]

# With two servers a majority is both: no server could fail, which is worse than one server.
MIN_MEMBERS = 3

logger = logging.getLogger("django_redis_lock")

# Used when no server's client sets a socket timeout.
_DEFAULT_REPLY_TIMEOUT = 5.0
# Once the outcome is decided, the other servers get this long again (at least _GRACE_MIN s)
# to answer too, so that a healthy server a little slower than the rest is not cut off (its
# connection would have to be dropped), while a silent one does not hold the caller up.
_GRACE_MIN = 0.002


class QuorumUnavailable(RedisConnectionError):
    """Too few servers of a quorum answered to reach a majority either way."""


class _Silent(RedisConnectionError):
    """A server that had not answered when the outcome was decided (or the time was up)."""


Replies = dict[int, Any]  # server index -> its reply, or the RedisError it gave


@dataclass(eq=False)
class _Link:
    """A connection to one server of the quorum, and the answers it still owes us."""

    connection: Any
    owed: int = 0
    silent_since: float = 0.0

    @property
    def socket(self) -> Any:
        return self.connection._sock  # private, but the one way to select() on it


def members(value: Any) -> tuple[str, ...]:
    """The cache aliases of a quorum, checked (``TypeError`` / ``ValueError``)."""
    if not isinstance(value, list | tuple):
        raise TypeError(f"A quorum is a list of cache aliases, not {type(value).__name__}.")
    for alias in value:
        if not isinstance(alias, str) or not alias:
            raise TypeError(f"A quorum's members are cache aliases (non-empty str), not {alias!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"A quorum names each cache alias once, not {list(value)!r}.")
    if len(value) < MIN_MEMBERS:
        raise ValueError(
            f"A quorum needs at least {MIN_MEMBERS} cache aliases on independent Redis servers, "
            f"not {len(value)}: with 2, a majority is both, so neither server may fail."
        )
    return tuple(value)


def _answered(reply: Any) -> bool:
    return not isinstance(reply, RedisError)


def _broken(reply: Any) -> bool:
    """An error of the connection, not an error reply of the server."""
    return isinstance(reply, RedisError) and not isinstance(reply, ResponseError)


def _readable(sockets: list[Any], timeout: float) -> list[Any]:
    """Those of ``sockets`` with something to read, waiting up to ``timeout`` seconds.

    poll(), not select(): select() cannot watch a descriptor numbered 1024 or more, which a
    busy process easily has."""
    if not hasattr(select, "poll"):  # pragma: no cover - Windows
        return select.select(sockets, [], [], timeout)[0]
    poller = select.poll()
    by_fd = {}
    for sock in sockets:
        poller.register(sock, select.POLLIN)
        by_fd[sock.fileno()] = sock
    return [by_fd[fd] for fd, _ in poller.poll(math.ceil(timeout * 1000))]


_NOTHING = object()  # no answer (yet): None is an answer (a nil reply)


def _read_reply(link: _Link) -> Any:
    try:
        return link.connection.read_response()
    except RedisError as exc:  # ResponseError: a complete error reply
        return exc


def _buffered(link: _Link) -> bool:
    try:
        return bool(link.connection.can_read(timeout=0))
    except RedisError:
        return True  # the next read reports it


def _is_list(reply: Any) -> bool:
    return isinstance(reply, list)


class QuorumClient:
    """Runs the lock engine's commands on several independent Redis servers, as a majority.

    It stands in for a redis-py client where the engine calls ``execute_command``; it is not a
    general-purpose client (only the commands the engine sends are understood).
    """

    def __init__(self, name: str, members: Sequence[tuple[str, Any]]) -> None:
        for alias, client in members:
            if getattr(client, "connection_pool", None) is None:
                raise ImproperlyConfigured(
                    f"Quorum {name}: cache alias {alias!r} gives a {type(client).__name__}; "
                    "each member of a quorum must be one Redis server (a plain redis.Redis "
                    "client), not a cluster."
                )
        self.name = name
        self.aliases = tuple(alias for alias, _ in members)
        self.clients = tuple(client for _, client in members)
        self.majority = len(self.clients) // 2 + 1
        timeouts = [
            client.connection_pool.connection_kwargs.get("socket_timeout")
            for client in self.clients
        ]
        self.reply_timeout = float(max((t for t in timeouts if t), default=_DEFAULT_REPLY_TIMEOUT))
        self._idle: list[list[_Link | None]] = []  # one connection per server each (_links)
        self._pid = os.getpid()
        self._scripts: dict[str, Callable[[list[str], list[Any]], Any]] = {
            TAKE.sha: self._acquire,
            RELEASE.sha: self._release,
            EXTEND.sha: self._extend,
        }

    def __repr__(self) -> str:
        return f"<QuorumClient {self.name} of {len(self.clients)} servers>"

    # -- the entry point: what commands.execute() calls for a client without a connection pool --

    def execute_command(self, *args: Any) -> Any:
        command = str(args[0]).upper()
        if command == "EVALSHA":
            sha, key_count = str(args[1]), int(args[2])
            if sha not in self._scripts:
                raise NotImplementedError(f"{self!r} runs only the lock engine's scripts.")
            keys = [str(key) for key in args[3 : 3 + key_count]]
            return self._scripts[sha](keys, list(args[3 + key_count :]))
        if command == "SCRIPT" and str(args[1]).upper() == "LOAD":
            return Script("loaded", str(args[2])).sha  # each server loads on demand (_run)
        if command in _READS:
            return self._read(command, args)
        raise NotImplementedError(f"{self!r} does not run {command}.")

    # -- I/O ------------------------------------------------------------------------------------

    def _links(self) -> list[_Link | None]:
        """One connection per server (None where there is none yet), reused across calls.

        Kept here rather than taken from each server's pool for every call: the pools' own
        checks cost more than a round trip on this path, three times over. Idle sockets are
        checked all at once instead, with one select()."""
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
            self._idle, self._pid = [], os.getpid()
        try:
            links = self._idle.pop()
        except IndexError:
            return [None] * len(self.clients)
        sockets = [link.socket for link in links if link is not None and link.socket]
        readable = _readable(sockets, 0) if sockets else []
        now = time.monotonic()
        for index, link in enumerate(links):
            if link is None:
                continue
            try:
                if link.socket is None:
                    raise RedisConnectionError("closed")
                if link.owed:
                    # Late answers of a server that was slow or silent: read and forget them.
                    while link.owed and link.connection.can_read(timeout=0):
                        with contextlib.suppress(ResponseError):  # an error reply is one too
                            link.connection.read_response()
                        link.owed -= 1
                    if link.owed and now - link.silent_since > self.reply_timeout:
                        raise RedisConnectionError("silent for too long")
                elif link.socket in readable:
                    raise RedisConnectionError("closed by the server, or out of step")
            except (RedisError, OSError):
                self._drop(index, link)
                links[index] = None
        return links

    def _drop(self, index: int, link: _Link) -> None:
        """Give a connection back to its pool closed, so that it is never reused as it is."""
        link.connection.disconnect()
        self.clients[index].connection_pool.release(link.connection)

    def broadcast(
        self,
        command: Sequence[Any],
        *,
        timeout: float,
        settled: Callable[[Replies], bool] | None = None,
        members: Sequence[int] | None = None,
    ) -> Replies:
        """Send ``command`` to every server (or to ``members``) at once, then read the replies
        as they arrive, until all have answered, or ``settled(replies)`` says the outcome is
        decided (then the others get a short grace), or ``timeout`` passes.

        A server that gave no answer gets a :class:`_Silent` error. Its connection is kept,
        with the answer still owed: later calls are sent behind it, in order, and read once
        its answers come (so a stopped server costs its vote, not a new connection and a
        socket timeout per call, and runs what it missed when it resumes). After
        ``reply_timeout`` without an answer the connection is replaced.
        """
        indexes = range(len(self.clients)) if members is None else members
        packed = pack(command)
        started = time.monotonic()
        deadline = started + timeout
        replies: Replies = {}
        links = self._links()
        try:
            waiting: dict[Any, int] = {}
            for index in indexes:
                link = links[index]
                try:
                    if link is None:
                        pool = self.clients[index].connection_pool
                        link = links[index] = _Link(pool.get_connection())
                    link.connection.send_packed_command([packed])
                except RedisError as exc:
                    replies[index] = exc
                    continue
                waiting[link.socket] = index
            decided = False
            while waiting:
                if not decided and settled is not None and settled(replies):
                    decided = True
                    now = time.monotonic()
                    deadline = min(deadline, now + max(_GRACE_MIN, now - started))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                ready = _readable(list(waiting), remaining)
                for sock in ready:
                    index = waiting[sock]
                    link = links[index]
                    assert link is not None
                    reply = _read_reply(link)
                    # Late answers to earlier calls come first. The answer to this call may
                    # have come with them, into the parser's buffer, where poll() cannot see it.
                    while link.owed and not _broken(reply):
                        link.owed -= 1
                        reply = _read_reply(link) if _buffered(link) else _NOTHING
                    if reply is not _NOTHING:
                        del waiting[sock]
                        replies[index] = reply
            now = time.monotonic()
            for index in waiting.values():
                link = links[index]
                assert link is not None
                link.owed += 1
                link.silent_since = now
                replies[index] = _Silent(f"no answer within {now - started:.3g}s")
        finally:
            for index, link in enumerate(links):
                reply = replies.get(index)
                if link is not None and (
                    (index in indexes and reply is None)  # interrupted: out of step
                    or (_broken(reply) and not isinstance(reply, _Silent))
                ):
                    self._drop(index, link)
                    links[index] = None
            self._idle.append(links)
        return replies

    def _run(
        self,
        script: Script,
        keys: Sequence[str],
        argv: Sequence[Any],
        *,
        timeout: float,
        settled: Callable[[Replies], bool] | None = None,
        members: Sequence[int] | None = None,
    ) -> Replies:
        replies = self.broadcast(
            ("EVALSHA", script.sha, len(keys), *keys, *argv),
            timeout=timeout,
            settled=settled,
            members=members,
        )
        for index, reply in replies.items():
            if isinstance(reply, NoScriptError):  # once per server and script, after a restart
                try:
                    replies[index] = script(self.clients[index], keys, argv)
                except RedisError as exc:
                    replies[index] = exc
        return replies

    def _decided_by(self, agrees: Callable[[Any], bool]) -> Callable[[Replies], bool]:
        """A ``settled`` test: a majority agrees, or too many servers answered no for one, or
        too many failed for a majority to answer at all. A mix of no's and failures is not
        settled: which outcome it is (taken by someone else, or too few servers) depends on
        the servers still to answer, so they are waited for."""
        spare = len(self.clients) - self.majority

        def settled(replies: Replies) -> bool:
            yes = no = failed = 0
            for reply in replies.values():
                if not _answered(reply):
                    failed += 1
                elif agrees(reply):
                    yes += 1
                else:
                    no += 1
            return yes >= self.majority or no > spare or failed > spare

        return settled

    def _unavailable(self, action: str, replies: Replies) -> QuorumUnavailable:
        answered = sum(1 for reply in replies.values() if _answered(reply))
        problems = "; ".join(
            f"{self.aliases[index]}: {type(reply).__name__.lstrip('_')}: {reply}"
            for index, reply in sorted(replies.items())
            if not _answered(reply)
        )
        return QuorumUnavailable(
            f"only {answered} of the {len(self.clients)} servers of quorum {self.name} "
            f"answered, and {self.majority} are needed to {action} a lock ({problems})"
        )

    # -- the scripts, as a majority ------------------------------------------------------------

    def _acquire(self, keys: list[str], argv: list[Any]) -> Any:
        token, lease_ms = str(argv[0]), int(argv[1])
        lease = lease_ms / 1000
        # A majority granted later than this is worthless.
        valid_for = lease - clock_allowance(lease)
        started = time.monotonic()

        majority_granted = self._decided_by(lambda reply: _is_list(reply) and reply[0] == 1)

        def settled(replies: Replies) -> bool:
            done = any(_is_list(reply) and reply[0] == 2 for reply in replies.values())
            return done or majority_granted(replies)

        replies = self._run(
            TAKE, keys, argv, timeout=max(0.0, min(self.reply_timeout, valid_for)),
            settled=settled,
        )  # fmt: skip
        granted = [index for index, reply in replies.items() if _is_list(reply) and reply[0] == 1]
        done = next((r for r in replies.values() if _is_list(r) and r[0] == 2), None)
        too_late = False
        if done is None and len(granted) >= self.majority:
            if time.monotonic() - started < valid_for:
                # The servers' clocks differ a little: the largest token is the one to count on.
                fence = max(int(replies[index][1]) for index in granted)
                return [1, fence, lease_ms, ""]
            too_late = True
        self._undo(keys[0], token, replies, granted)
        if done is not None:
            return done
        refused = [reply for reply in replies.values() if _is_list(reply) and reply[0] == 0]
        if len(refused) + len(granted) < self.majority:
            unreachable = [r for r in replies.values() if isinstance(r, RedisError)]
            # Silent only because our own time (the lease's validity) ran out: too late, not
            # too few servers.
            too_late = valid_for < self.reply_timeout and all(
                isinstance(reply, _Silent) for reply in unreachable
            )
            if not too_late:
                raise self._unavailable("take", replies)
        if too_late:
            logger.warning(
                "Quorum %s: no majority granted %s within its lease of %ss, less %.3fs for "
                "clock drift: given back. Quorum leases must be far longer than a round trip.",
                self.name, keys[0], lease, clock_allowance(lease),
            )  # fmt: skip
        holder = next((reply[2] for reply in refused if reply[2]), None)
        wait_ms = min((int(reply[1]) for reply in refused if int(reply[1]) > 0), default=1)
        return [0, wait_ms, holder]

    def _undo(self, lease: str, token: str, replies: Replies, granted: list[int]) -> None:
        """Give back what a failed acquisition got. Servers that did not answer may have
        granted it too: they are told as well, but not waited for."""
        members = [
            index for index, reply in replies.items() if index in granted or not _answered(reply)
        ]
        if not members:
            return
        with_grants = set(granted)
        self._run(
            RELEASE, LockKeys.of(lease).release_keys(""), [token, ""], members=members,
            timeout=self.reply_timeout,
            settled=lambda answers: with_grants.issubset(answers),
        )  # fmt: skip

    def _release(self, keys: list[str], argv: list[Any]) -> list[int]:
        """[0] released by a majority, [-1] a majority says it was not ours (any more), [-2]
        the key is not a lock (on a server that answered, where none released it)."""
        replies = self._run(
            RELEASE, keys, argv, timeout=self.reply_timeout,
            settled=self._decided_by(lambda reply: _is_list(reply) and int(reply[0]) >= 0),
        )  # fmt: skip
        codes = [int(reply[0]) for reply in replies.values() if _is_list(reply)]
        released = sum(1 for code in codes if code >= 0)
        if released >= self.majority:
            return [0]
        unknown = sum(1 for reply in replies.values() if not _answered(reply))
        if released + unknown >= self.majority:
            raise self._unavailable("release", replies)
        return [-2] if -2 in codes and not released else [-1]

    def _extend(self, keys: list[str], argv: list[Any]) -> int:
        lease = int(argv[1]) / 1000
        started = time.monotonic()
        replies = self._run(
            EXTEND, keys, argv, timeout=min(self.reply_timeout, lease / 3),
            settled=self._decided_by(lambda reply: reply == 1),
        )  # fmt: skip
        extended = sum(1 for reply in replies.values() if reply == 1)
        in_time = time.monotonic() - started < lease - clock_allowance(lease)
        if extended >= self.majority and in_time:
            return 1
        unknown = sum(1 for reply in replies.values() if not _answered(reply))
        if extended + unknown >= self.majority:
            raise self._unavailable("renew", replies)
        return 0

    def _read(self, command: str, args: Sequence[Any]) -> Any:
        replies = self.broadcast(
            args,
            timeout=self.reply_timeout,
            settled=lambda answers: sum(map(_answered, answers.values())) >= self.majority,
        )
        answers = [reply for reply in replies.values() if _answered(reply)]
        if len(answers) < self.majority:
            raise self._unavailable("read", replies)
        return _READS[command](answers, self.majority)


def _exists(answers: list[Any], majority: int) -> int:
    return int(sum(int(answer) for answer in answers) >= majority)


def _agreed_lease(answers: list[Any], majority: int) -> Any:
    """The lease a majority agrees on: the same token (each server wrote its own ``since``
    and fence), or None."""
    tokens = [
        answer.split(b"|", 1)[0] if isinstance(answer, bytes) else None for answer in answers
    ]
    for answer, token in zip(answers, tokens, strict=True):
        if token is not None and tokens.count(token) >= majority:
            return answer
    return None


def _majority_pttl(answers: list[Any], majority: int) -> int:
    # The lease lasts as long as a majority still has it: the majority-th longest. A key
    # without an expiry (-1) lasts longest of all, and is not hidden as "no key" (-2).
    pttls = [int(answer) for answer in answers]
    pttl = sorted(pttls, key=lambda ms: math.inf if ms == -1 else ms, reverse=True)[majority - 1]
    return pttl if pttl >= -1 else -2


_READS: dict[str, Callable[[list[Any], int], Any]] = {
    "EXISTS": _exists,
    "GET": _agreed_lease,
    "PTTL": _majority_pttl,
}


class AsyncQuorumClient:
    """:class:`QuorumClient` for the async lock API: each operation runs in a worker thread
    (the servers are still asked at once), and the delays between a waiter's looks are
    ``asyncio.sleep``, so the event loop is never blocked."""

    def __init__(self, quorum: QuorumClient) -> None:
        self.quorum = quorum

    def __repr__(self) -> str:
        return f"<AsyncQuorumClient {self.quorum.name}>"

    async def execute_command(self, *args: Any) -> Any:
        return await asyncio.to_thread(self.quorum.execute_command, *args)

    async def aclose(self) -> None:
        """Nothing to close: the servers' connections belong to their sync clients."""
