"""Quorum mode: one lock on several independent Redis servers, held while a majority holds it.

    DJANGO_REDIS_LOCK_QUORUMS = {"redlock": ["locks-a", "locks-b", "locks-c"]}   # cache aliases
    Lock("payments:42", using="redlock")          # or Lock(..., using=["locks-a", ...])

This is the Redlock algorithm. Each server runs the same scripts as in single-server mode;
:class:`QuorumClient` sends each script to every server at once and answers as the majority
does, so ``Lock``, the watchdog and the guards built on them have no quorum-specific code
beyond ``QuorumBackend`` saying there is no queue:

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
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import ConnectionError as RedisConnectionError

from ...core.durations import clock_allowance, readable
from ...core.lease import LockKeys
from ..scripts import EXTEND, RELEASE, TAKE, Script
from .broadcast import Broadcaster, Replies, Silent, answered
from .votes import READS, fence_of, is_list, release_code

__all__ = ["AsyncQuorumClient", "QuorumClient", "QuorumUnavailable"]

logger = logging.getLogger("django_redis_lock")


class QuorumUnavailable(RedisConnectionError):
    """Too few servers of a quorum answered to reach a majority either way."""


class QuorumClient:
    """Runs the lock engine's commands on several independent Redis servers, as a majority.

    It stands in for a redis-py client where the engine calls ``execute_command``; it is not a
    general-purpose client (only the commands the engine sends are understood).
    """

    def __init__(
        self,
        name: str,
        members: Sequence[tuple[str, Any]],
        scripts: Mapping[str, Script] | None = None,
    ) -> None:
        """``scripts``: the engine's ``take``, ``release`` and ``extend`` scripts by name
        (``backends.server.SCRIPTS``'s; a simulation brings them on its own clock)."""
        for alias, client in members:
            if not isinstance(client, redis.Redis):
                raise ImproperlyConfigured(
                    f"Quorum {name}: cache alias {alias!r} gives a {type(client).__name__}; "
                    "each member of a quorum must be one Redis server (a plain redis.Redis "
                    "client), not a cluster."
                )
        self.name = name
        self.aliases = tuple(alias for alias, _ in members)
        self.clients = tuple(client for _, client in members)
        self.majority = len(self.clients) // 2 + 1
        self.servers = Broadcaster(self.clients)
        self.reply_timeout = self.servers.reply_timeout
        given = scripts or {}
        self._take = given.get("take", TAKE)
        self._release_script = given.get("release", RELEASE)
        self._extend_script = given.get("extend", EXTEND)
        self._scripts: dict[str, Callable[[list[str], list[Any]], Any]] = {
            self._take.sha: self._acquire,
            self._release_script.sha: self._release,
            self._extend_script.sha: self._extend,
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
            return Script("loaded", str(args[2])).sha  # each server loads it on demand
        if command == "SET":
            return self._set(args)
        if command in READS:
            return self._read(command, args)
        raise NotImplementedError(f"{self!r} does not run {command}.")

    def _decided_by(self, agrees: Callable[[Any], bool]) -> Callable[[Replies], bool]:
        """A ``settled`` test: a majority agrees, or too many servers answered no for one, or
        too many failed for a majority to answer at all. A mix of no's and failures is not
        settled: which outcome it is (taken by someone else, or too few servers) depends on
        the servers still to answer, so they are waited for."""
        spare = len(self.clients) - self.majority

        def settled(replies: Replies) -> bool:
            yes = no = failed = 0
            for reply in replies.values():
                if not answered(reply):
                    failed += 1
                elif agrees(reply):
                    yes += 1
                else:
                    no += 1
            return yes >= self.majority or no > spare or failed > spare

        return settled

    def _silent_ones(self, replies: Replies) -> str:
        """The servers that gave no answer, and why: ``q1: Silent: no answer within 2s``."""
        return "; ".join(
            f"{self.aliases[index]}: {type(reply).__name__}: {reply}"
            for index, reply in sorted(replies.items())
            if not answered(reply)
        )

    def _unavailable(
        self, action: str, replies: Replies, done: tuple[int, str] | None = None
    ) -> QuorumUnavailable:
        """Too few servers answered to ``action`` the lock, or (``done``: how many did what,
        ``(1, "renewed it")``) too few of them agreed."""
        count = sum(1 for reply in replies.values() if answered(reply))
        servers = f"of the {len(self.clients)} servers of quorum {self.name}"
        needed = (
            f"and {self.majority} are needed to {action} a lock ({self._silent_ones(replies)})"
        )
        if done is None:
            return QuorumUnavailable(f"only {count} {servers} answered, {needed}")
        number, verb = done
        if count < self.majority:
            return QuorumUnavailable(
                f"only {count} {servers} answered ({number} {verb}), {needed}"
            )
        return QuorumUnavailable(
            f"only {number} {servers} {verb} ({count} answered, {count - number} refusing), "
            f"{needed}"
        )

    # -- the scripts, as a majority ------------------------------------------------------------

    def _acquire(self, keys: list[str], argv: list[Any]) -> Any:
        """take.lua as a majority (fenced acquisitions, and guards that want a result)."""
        token, lease_ms = str(argv[0]), int(argv[1])

        def granted(reply: Any) -> bool:
            return is_list(reply) and reply[0] == 1

        def done(reply: Any) -> bool:
            return is_list(reply) and reply[0] == 2

        outcome = self._take_majority(
            lambda timeout, settled: self.servers.run(
                self._take, keys, argv, timeout=timeout, settled=settled
            ),
            keys[0], token, lease_ms, granted=granted, final=done,
        )  # fmt: skip
        if isinstance(outcome, int):
            return [1, outcome, lease_ms, ""]
        replies = outcome
        finished = next((reply for reply in replies.values() if done(reply)), None)
        if finished is not None:
            return finished
        refused = [reply for reply in replies.values() if is_list(reply) and reply[0] == 0]
        holder = next((reply[2] for reply in refused if reply[2]), None)
        wait_ms = min((int(reply[1]) for reply in refused if int(reply[1]) > 0), default=1)
        return [0, wait_ms, holder]

    def _set(self, args: Sequence[Any]) -> Any:
        """``SET lease value NX PX ms`` as a majority: an acquisition with no script (no
        fencing token, no result wanted). True when a majority set it in time, else None."""
        if len(args) != 6 or [str(arg).upper() for arg in args[3:5]] != ["NX", "PX"]:
            raise NotImplementedError(f"{self!r} runs SET only as SET key value NX PX ms.")
        key, value, lease_ms = str(args[1]), args[2], int(args[5])
        token = (value.decode() if isinstance(value, bytes) else str(value)).split("|", 1)[0]
        outcome = self._take_majority(
            lambda timeout, settled: self.servers.send(args, timeout=timeout, settled=settled),
            key, token, lease_ms, granted=lambda reply: reply is True or reply == b"OK",
        )  # fmt: skip
        return True if isinstance(outcome, int) else None

    def _take_majority(
        self,
        send: Callable[[float, Callable[[Replies], bool]], Replies],
        key: str,
        token: str,
        lease_ms: int,
        *,
        granted: Callable[[Any], bool],
        final: Callable[[Any], bool] = lambda reply: False,
    ) -> int | Replies:
        """Redlock's rule for one attempt: ``send(timeout, settled)`` to every server; the lock
        is ours when a majority ``granted`` it within the lease less a clock-drift allowance
        (measured on the monotonic clock). Returns the fencing token (the largest a granting
        server gave, 0 when they give none) when it is ours; else gives back what was granted
        and returns the replies (a ``final`` one ends the attempt at once). Raises
        :class:`QuorumUnavailable` when too few servers answered to tell."""
        lease = lease_ms / 1000
        valid_for = lease - clock_allowance(lease)  # a majority granted later is worthless
        started = time.monotonic()
        majority_granted = self._decided_by(granted)

        def settled(replies: Replies) -> bool:
            return any(map(final, replies.values())) or majority_granted(replies)

        replies = send(max(0.0, min(self.reply_timeout, valid_for)), settled)
        grants = [index for index, reply in replies.items() if granted(reply)]
        ended = any(map(final, replies.values()))
        too_late = False
        if not ended and len(grants) >= self.majority:
            if time.monotonic() - started < valid_for:
                # The servers' clocks differ a little: the largest token is the one to count on.
                return max((fence_of(replies[index]) for index in grants), default=0)
            too_late = True
        self._undo(key, token, replies, grants)
        if ended:
            return replies
        answers = sum(1 for reply in replies.values() if answered(reply))
        if answers < self.majority:
            # Silent only because our own time (the lease's validity) ran out: too late, not
            # too few servers.
            too_late = valid_for < self.reply_timeout and all(
                isinstance(reply, Silent) for reply in replies.values() if not answered(reply)
            )
            if not too_late:
                raise self._unavailable("take", replies)
        if too_late:
            logger.warning(
                "Quorum %s: no majority granted %s within its lease of %s, less %s for "
                "clock drift: given back. Quorum leases must be far longer than a round trip.",
                self.name, key, readable(lease), readable(clock_allowance(lease)),
            )  # fmt: skip
        return replies

    def _undo(self, lease: str, token: str, replies: Replies, granted: list[int]) -> None:
        """Give back what a failed acquisition got. Servers that did not answer may have
        granted it too: they are told as well, but not waited for."""
        members = [
            index for index, reply in replies.items() if index in granted or not answered(reply)
        ]
        if not members:
            return
        with_grants = set(granted)
        self.servers.run(
            self._release_script, LockKeys.of(lease).release_keys("", token), [token, ""],
            members=members, timeout=self.reply_timeout,
            settled=lambda answers: with_grants.issubset(answers),
        )  # fmt: skip

    def _release(self, keys: list[str], argv: list[Any]) -> list[int]:
        """[0] released by a majority, [-1] a majority says it was not ours (any more), [-2]
        the key is not a lock (on a server that answered, where none released it).

        The servers whose answers decide it are waited for up to ``reply_timeout`` (the
        members' socket timeout). A server still silent then keeps its copy of the lease until
        the lease ends: when fewer than a majority may still hold it, nobody can hold the lock
        on a majority any more, and the release counts if the silent ones could have made a
        majority of releases (it was ours where it answered); only when a majority may still
        hold it does it fail (:class:`QuorumUnavailable`)."""
        replies = self.servers.run(
            self._release_script, keys, argv, timeout=self.reply_timeout,
            settled=self._decided_by(lambda reply: release_code(reply) >= 0),
        )  # fmt: skip
        codes = [code for reply in replies.values() if (code := release_code(reply)) > -3]
        released = sum(1 for code in codes if code >= 0)
        if released >= self.majority:
            return [0]
        unknown = [index for index, reply in replies.items() if not answered(reply)]
        if len(unknown) >= self.majority:
            raise self._unavailable("release", replies, (released, "released it"))
        if released and released + len(unknown) >= self.majority:
            logger.warning(
                "Quorum %s: %s released by %d of %d servers, not ours on the others that "
                "answered; %s did not answer within %s: its copy ends with its lease (%s).",
                self.name, keys[0], released, len(self.clients),
                ", ".join(self.aliases[index] for index in unknown),
                readable(self.reply_timeout), self._silent_ones(replies),
            )  # fmt: skip
            return [0]
        return [-2] if -2 in codes and not released else [-1]

    def _extend(self, keys: list[str], argv: list[Any]) -> int:
        lease = int(argv[1]) / 1000
        started = time.monotonic()
        replies = self.servers.run(
            self._extend_script, keys, argv, timeout=min(self.reply_timeout, lease / 3),
            settled=self._decided_by(lambda reply: reply == 1),
        )  # fmt: skip
        extended = sum(1 for reply in replies.values() if reply == 1)
        in_time = time.monotonic() - started < lease - clock_allowance(lease)
        if extended >= self.majority and in_time:
            return 1
        if extended >= self.majority:
            raise QuorumUnavailable(
                f"{extended} of the {len(self.clients)} servers of quorum {self.name} renewed "
                f"{keys[0]}, but only after {readable(time.monotonic() - started)}: past its "
                f"lease of {readable(lease)}, less {readable(clock_allowance(lease))} for clock "
                "drift"
            )
        unknown = sum(1 for reply in replies.values() if not answered(reply))
        if extended + unknown >= self.majority:
            raise self._unavailable("renew", replies, (extended, "renewed it"))
        return 0

    def _read(self, command: str, args: Sequence[Any]) -> Any:
        replies = self.servers.send(
            args,
            timeout=self.reply_timeout,
            settled=lambda answers: sum(map(answered, answers.values())) >= self.majority,
        )
        answers = [reply for reply in replies.values() if answered(reply)]
        if len(answers) < self.majority:
            raise self._unavailable("read", replies)
        return READS[command](answers, self.majority)

    def give_back(self, commands: Sequence[Sequence[Any]]) -> None:
        """Send ``commands`` (an interrupted acquisition's give-back: ``EVAL`` s) to every
        server, without waiting for their answers (read, and forgotten, by later calls): on the
        connections the acquisition used, in step, so each runs after what it sent."""
        for command in commands:
            self.servers.send(command, timeout=0)


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
