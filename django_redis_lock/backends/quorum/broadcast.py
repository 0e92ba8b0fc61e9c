"""One command to several independent Redis servers at once, answers read as they arrive.

``client.py`` (quorum mode) is built on :meth:`Broadcaster.send`. Only redis-py's public
connection API is used (``get_connection``, ``send_packed_command``, ``can_read``,
``read_response``, ``disconnect``): redis-py offers no public way to wait on several
connections at once (``select()`` needs the socket, which is private), so :func:`_next_ready`
looks at each connection without waiting and, when none has answered, waits on one of them
for a short slice, in turn. A healthy server's answer ends its slice at once; a silent one
delays noticing the others' answers by one slice at most.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ...core.durations import readable
from ..scripts import Script
from ..wire import pack, pack_all

__all__ = ["Broadcaster", "GiveBack", "Replies", "Silent", "answered", "giving_back"]

# Used when no server's client sets a socket timeout.
_DEFAULT_REPLY_TIMEOUT = 5.0
# Once the outcome is decided, the other servers get this long again (at least _GRACE_MIN s)
# to answer too, so that a healthy server a little slower than the rest is not cut off (its
# connection would have to be dropped), while a silent one does not hold the caller up.
_GRACE_MIN = 0.002
# The longest wait on one connection while others may have answered meanwhile.
_SLICE = 0.0005

Replies = dict[int, Any]  # server index -> its reply, or the RedisError it gave


@dataclass(eq=False)
class GiveBack:
    """What goes back if the caller is interrupted (``KeyboardInterrupt`` from a signal
    handler, ``SystemExit``) while an acquisition is under way: ``commands()`` makes it (one
    ``EVAL`` each: nothing loaded is needed), and ``sent`` says whether it went already."""

    commands: Callable[[], Sequence[Sequence[Any]]]
    sent: bool = False


# The give-back of the acquisition under way in this thread or task (:func:`giving_back`).
_GIVE_BACK: ContextVar[GiveBack | None] = ContextVar("django_redis_lock_give_back", default=None)


@contextlib.contextmanager
def giving_back(give_back: GiveBack) -> Iterator[GiveBack]:
    """While inside, an interrupted :meth:`Broadcaster.send` sends ``give_back`` behind its
    request on every connection the request went out on, before the interrupt goes on: each
    server runs it right after the request, whenever it runs that (as ``wire.execute`` does
    on one server). Sent on other connections, it could overtake the request there."""
    reset = _GIVE_BACK.set(give_back)
    try:
        yield give_back
    finally:
        _GIVE_BACK.reset(reset)


class Silent(RedisConnectionError):
    """A server that had not answered when the outcome was decided (or the time was up)."""


def answered(reply: Any) -> bool:
    """The server answered with a reply (not an error, nor silence)."""
    return not isinstance(reply, RedisError)


def _broken(reply: Any) -> bool:
    """An error of the connection, not an error reply of the server."""
    return isinstance(reply, RedisError) and not isinstance(reply, ResponseError)


@dataclass(eq=False)
class _Link:
    """A connection to one server, and the answers it still owes us."""

    connection: Any
    owed: int = 0
    silent_since: float = 0.0

    def __post_init__(self) -> None:
        # Closed by someone else (a pool's disconnect()), redis-py connects again when the
        # connection is next used: the answers owed died with the old socket.
        self.connection.register_connect_callback(self.reconnected)

    def reconnected(self, connection: Any) -> None:
        self.owed = 0

    def ready(self, timeout: float = 0) -> bool:
        """Something to read (an answer, or the news that the connection broke)."""
        try:
            return bool(self.connection.can_read(timeout=timeout))
        except (RedisError, OSError):
            return True  # the next read reports it


_NOTHING = object()  # no answer (yet): None is an answer (a nil reply)


def _read_reply(link: _Link) -> Any:
    try:
        return link.connection.read_response()
    except (RedisError, OSError) as exc:  # ResponseError: a complete error reply
        return exc if isinstance(exc, RedisError) else RedisConnectionError(str(exc))


def _give_back_behind(sent: Sequence[_Link]) -> None:
    """The caller was interrupted: the give-back of its acquisition, if one is under way,
    behind the request on each connection it went out on (whether answered or not: a server
    that granted it has answered)."""
    give_back = _GIVE_BACK.get()
    if give_back is None or not sent:
        return
    give_back.sent = True
    data = pack_all(give_back.commands())
    for link in sent:
        with contextlib.suppress(RedisError, OSError):
            link.connection.send_packed_command([data], check_health=False)


def _whole_behind(whole: bytes, unanswered: Sequence[_Link]) -> None:
    """The caller was interrupted while a script's ``EVALSHA`` was unanswered: the script
    goes out whole behind it on each of those connections, before they are dropped. A server
    that answers ``NOSCRIPT`` (its first call of the script, or after a restart) runs that
    instead, as one that has the script runs the ``EVALSHA``: what was sent is run either way,
    as on one server. (Run twice where both run: a release, a renewal or an attempt finds its
    own work done, and an attempt's give-back follows both.)"""
    for link in unanswered:
        with contextlib.suppress(RedisError, OSError):
            link.connection.send_packed_command([whole], check_health=False)


def _next_ready(pending: list[_Link], deadline: float, turn: int) -> list[_Link]:
    """Those of ``pending`` with something to read, waiting until ``deadline`` at most: a
    look at each, then (when none is ready) a wait of one slice on ``pending[turn]``."""
    ready = [link for link in pending if link.ready()]
    if ready:
        return ready
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return []
    if pending[turn % len(pending)].ready(min(_SLICE, remaining)):
        return [link for link in pending if link.ready()]
    return []


class Broadcaster:
    """Sends commands to every one of ``clients`` (plain ``redis.Redis``, one per server) at
    once, on one connection per server kept between calls."""

    def __init__(self, clients: Sequence[Any]) -> None:
        self.clients = tuple(clients)
        timeouts = [
            client.connection_pool.connection_kwargs.get("socket_timeout")
            for client in self.clients
        ]
        self.reply_timeout = float(max((t for t in timeouts if t), default=_DEFAULT_REPLY_TIMEOUT))
        self._idle: list[list[_Link | None]] = []  # one connection per server each (_links)
        self._pid = os.getpid()

    def _links(self) -> list[_Link | None]:
        """One connection per server (None where there is none yet), reused across calls.

        Kept here rather than taken from each server's pool for every call: the pools' own
        checks cost more than a round trip on this path, three times over. An idle
        connection with something to read was closed by its server or is out of step."""
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
            self._idle, self._pid = [], os.getpid()
        try:
            links = self._idle.pop()
        except IndexError:
            return [None] * len(self.clients)
        now = time.monotonic()
        for index, link in enumerate(links):
            if link is None:
                continue
            try:
                if link.owed:
                    # Late answers of a server that was slow or silent: read and forget them.
                    while link.owed and link.connection.can_read(timeout=0):
                        with contextlib.suppress(ResponseError):  # an error reply is one too
                            link.connection.read_response()
                        link.owed -= 1
                    if link.owed and now - link.silent_since > self.reply_timeout:
                        raise RedisConnectionError("silent for too long")
                elif link.ready():
                    raise RedisConnectionError("closed by the server, or out of step")
            except (RedisError, OSError):
                self._drop(index, link)
                links[index] = None
        return links

    def _drop(self, index: int, link: _Link) -> None:
        """Give a connection back to its pool closed, so that it is never reused as it is."""
        link.connection.deregister_connect_callback(link.reconnected)
        link.connection.disconnect()
        self.clients[index].connection_pool.release(link.connection)

    def send(
        self,
        command: Sequence[Any],
        *,
        timeout: float,
        settled: Callable[[Replies], bool] | None = None,
        members: Sequence[int] | None = None,
        unloaded: Sequence[Any] | None = None,
    ) -> Replies:
        """Send ``command`` to every server (or to ``members``) at once, then read the replies
        as they arrive, until all have answered, or ``settled(replies)`` says the outcome is
        decided (then the others get a short grace), or ``timeout`` passes.

        ``unloaded``: for a script's ``EVALSHA``, the same script as one command that needs
        nothing loaded (``EVAL`` of its source). A server that answers ``NOSCRIPT`` (after it
        started, or a ``SCRIPT FLUSH``) is sent it at once, on the same connection, and its
        answer to that is its reply: a ``NOSCRIPT`` is no answer, and never decides anything
        (counted as a failure, it decided a release before the one server that could tell had
        answered).

        A server that gave no answer gets a :class:`Silent` error. Its connection is kept,
        with the answer still owed: later calls are sent behind it, in order, and read once
        its answers come (so a stopped server costs its vote, not a new connection and a
        socket timeout per call, and runs what it missed when it resumes). After
        ``reply_timeout`` without an answer the connection is replaced.
        """
        indexes = range(len(self.clients)) if members is None else members
        packed = pack(command)
        whole = None if unloaded is None else pack(unloaded)
        started = time.monotonic()
        deadline = started + timeout
        replies: Replies = {}
        links = self._links()
        sent: list[_Link] = []  # (and the one being sent: it may have gone)
        resent: set[_Link] = set()  # sent whole after a NOSCRIPT
        try:
            waiting: dict[_Link, int] = {}
            for index in indexes:
                link = links[index]
                try:
                    if link is None:
                        pool = self.clients[index].connection_pool
                        link = links[index] = _Link(pool.get_connection())
                    sent.append(link)
                    link.connection.send_packed_command([packed])
                except RedisError as exc:
                    replies[index] = exc
                    continue
                waiting[link] = index
            decided = False
            turn = 0
            while waiting:
                if not decided and settled is not None and settled(replies):
                    decided = True
                    now = time.monotonic()
                    deadline = min(deadline, now + max(_GRACE_MIN, now - started))
                if time.monotonic() >= deadline:
                    break
                turn += 1
                for link in _next_ready(list(waiting), deadline, turn):
                    reply = _read_reply(link)
                    # Late answers to earlier calls come first. The answer to this call may
                    # have come with them, into the parser's buffer.
                    while link.owed and not _broken(reply):
                        link.owed -= 1
                        reply = _read_reply(link) if link.ready() else _NOTHING
                    if reply is _NOTHING:
                        continue
                    if whole is not None and isinstance(reply, NoScriptError):
                        try:
                            link.connection.send_packed_command([whole])
                            resent.add(link)
                            continue  # its answer to the script sent whole is the one
                        except RedisError as exc:
                            reply = exc
                    replies[waiting.pop(link)] = reply
            now = time.monotonic()
            for link, index in waiting.items():
                link.owed += 1
                link.silent_since = now
                replies[index] = Silent(f"no answer within {readable(now - started)}")
        except RedisError:
            raise
        except BaseException:
            if whole is not None:  # (those sent it that have not answered, nor had it whole)
                unanswered = [links[index] for index in indexes if index not in replies]
                _whole_behind(whole, [
                    link for link in unanswered if link in sent and link not in resent
                ])  # fmt: skip
            _give_back_behind(sent)  # (those connections are dropped below)
            raise
        finally:
            for index, link in enumerate(links):
                reply = replies.get(index)
                if link is not None and (
                    (index in indexes and reply is None)  # interrupted: out of step
                    or (_broken(reply) and not isinstance(reply, Silent))
                ):
                    self._drop(index, link)
                    links[index] = None
            self._idle.append(links)
        return replies

    def run(
        self,
        script: Script,
        keys: Sequence[str],
        argv: Sequence[Any],
        *,
        timeout: float,
        settled: Callable[[Replies], bool] | None = None,
        members: Sequence[int] | None = None,
    ) -> Replies:
        """:meth:`send` for one of our scripts, sent whole where a server does not have it
        (once per server and script: ``EVAL`` loads it too)."""
        return self.send(
            ("EVALSHA", script.sha, len(keys), *keys, *argv),
            timeout=timeout,
            settled=settled,
            members=members,
            unloaded=script.command(keys, argv),
        )
