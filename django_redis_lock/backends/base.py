"""What every backend shares, sync or async, whatever its topology: :class:`Backend` (what
it tells the flows, and the one mapping of the core's requests onto its methods), the script
table, and the small helpers the topologies use.

A backend carries out the core's requests (``core/requests.py``) by a handful of methods that
each topology implements its own way (``send``, ``send_many``, ``run_script``,
``acknowledged``, ``wait``, ``run_then_wait``, ``drop_stale``); :meth:`Backend.call` maps a
request onto them, once for both drivers. What a reader of live state asks of a topology
(the servers to ``SCAN``, the server of a key, a read that a majority must answer, renewing many
leases) is a method of the sync backends too (``server.py``), so nothing outside ``backends/``
asks which topology it runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ClusterError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core.release import give_back
from ..core.requests import Block, Command, Eval, Failover, Pipeline, Request
from .scripts import (
    EXTEND,
    JOIN,
    PERMIT_ACQUIRE,
    PERMIT_EXTEND,
    PERMIT_RELEASE,
    RELEASE,
    TAKE,
    TAKE_MANY,
    WAKE,
    Script,
)

__all__ = ["SCRIPTS", "Backend", "aone_by_one", "grants", "one_by_one", "shortened", "silent"]

SCRIPTS: dict[str, Script] = {
    script.name: script
    for script in (
        TAKE,
        TAKE_MANY,
        JOIN,
        RELEASE,
        EXTEND,
        PERMIT_ACQUIRE,
        PERMIT_RELEASE,
        PERMIT_EXTEND,
        WAKE,
    )
}


def grants(reply: Any) -> bool:
    """A reply worth confirming by replicas: a lease granted or extended."""
    return bool(reply == 1 or (isinstance(reply, list) and reply[0] == 1))


def silent(
    give_back: Eval | tuple[Eval, ...] | None,
) -> Callable[[], list[Sequence[Any]]] | None:
    """What to send after a request whose reply went unread (its give-back: the commands, one
    per script), if any."""
    if give_back is None:
        return None
    each = (give_back,) if isinstance(give_back, Eval) else give_back
    return lambda: [SCRIPTS[e.script].command(e.keys, e.args) for e in each]


def give_back_command(keys: Any, token: str) -> list[Sequence[Any]]:
    """The give-back (``release.give_back``) of an acquisition by ``token`` of the lock of
    ``keys``, as ``silent`` sends it (one ``EVAL``, which needs nothing loaded): for the flat
    path, which makes it only if a reply never comes (``functools.partial``)."""
    request = give_back(keys, token)
    return [SCRIPTS[request.script].command(request.keys, request.args)]


def shortened(request: Block, reply: Any) -> tuple[float, bool]:
    """How long a block sent after ``request.first`` lasts, given its reply: ``after_first``
    is called with it (before the block, whose length it may shorten)."""
    limit = request.after_first(reply) if request.after_first is not None else request.seconds
    if limit < request.seconds:
        return max(limit, 0.001), True
    return request.seconds, request.exact


def one_by_one(send: Callable[..., Any], commands: Sequence[Sequence[Any]]) -> list[Any]:
    """``send_many`` where commands cannot share a round trip: each ``send``, error replies
    in place. A command that fails otherwise (its connection broke) does not keep the next
    from being sent (each a give-back, or a wake-up, of its own lock): the first such failure
    is raised once every command was tried."""
    replies: list[Any] = []
    failure: RedisError | None = None
    for command in commands:
        try:
            replies.append(send(*command))
        except ResponseError as error:
            replies.append(error)
        except RedisError as error:
            failure = failure or error
    if failure is not None:
        raise failure
    return replies


async def aone_by_one(send: Callable[..., Any], commands: Sequence[Sequence[Any]]) -> list[Any]:
    """:func:`one_by_one` for asyncio: ``send`` returns an awaitable."""
    replies: list[Any] = []
    failure: RedisError | None = None
    for command in commands:
        try:
            replies.append(await send(*command))
        except ResponseError as error:
            replies.append(error)
        except RedisError as error:
            failure = failure or error
    if failure is not None:
        raise failure
    return replies


class Backend:
    """What every backend, sync or async, tells the flows about its topology."""

    queues = True  # waiters queue and are woken (quorum mode polls instead)
    # What the client library sends on its own for this topology, beside our commands (for the
    # ACL rule, backends/acl.py).
    client_commands: tuple[str, ...] = ()

    def __init__(self, client: Any) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.client!r}>"

    @staticmethod
    def retry_soon(error: BaseException) -> bool:
        """Redis Cluster's ``TRYAGAIN``: the lock's slot is being moved, some of its keys are
        here and some there; asking again shortly works. (redis-py's Cluster clients retry it
        themselves for a while, then give up with "TTL exhausted".)"""
        if isinstance(error, ClusterError):
            return "TTL exhausted" in str(error)
        return isinstance(error, ResponseError) and str(error).startswith("TRYAGAIN")

    def one_script(self, keys: Sequence[str]) -> bool:
        """Whether one script may touch all of ``keys`` (``lock_many``): on one server, yes."""
        return True

    @staticmethod
    def unreachable(error: BaseException) -> bool:
        """No use sending anything more now (telling the queue we leave, say)."""
        return isinstance(error, RedisTimeoutError)

    def send_request(self, *args: Any, **options: Any) -> Any:
        """``send``, as one of the engine's requests (the flat uncontended path's, which skips
        :meth:`call`): a backend's first request may need something done first (one server's
        loads a script, see ``server.py``). Async twins: an awaitable."""
        return self.send(*args, **options)

    def call(self, request: Request) -> Any:
        """Carry ``request`` out by the method of this backend that does it: a sync backend's
        call returns the reply, an async twin's returns an awaitable of it (its methods are
        coroutine functions). So the mapping is written once for both drivers; ``perform`` is
        this call (sync) or awaits it (async)."""
        kind = type(request)
        if kind is Command:
            assert isinstance(request, Command)
            return self.send(
                *request.args,
                reply_timeout=request.reply_timeout, if_silent=silent(request.give_back),
            )  # fmt: skip
        if kind is Eval:
            assert isinstance(request, Eval)
            script = SCRIPTS[request.script]
            if request.replicas:
                return self.acknowledged(
                    script, request.keys, request.args, request.replicas,
                    request.replica_timeout_ms, grants,
                )  # fmt: skip
            return self.run_script(
                script, request.keys, request.args,
                reply_timeout=request.reply_timeout, if_silent=silent(request.give_back),
            )  # fmt: skip
        if kind is Block:
            assert isinstance(request, Block)
            if request.first is not None:
                return self.run_then_wait(request, request.first)
            return self.wait(request.key, request.seconds, request.exact)
        if kind is Pipeline:
            assert isinstance(request, Pipeline)
            return self.send_many(request.commands)
        if kind is Failover:
            assert isinstance(request, Failover)
            return self.drop_stale(request.key)
        raise TypeError(f"{type(self).__name__} cannot carry out {request!r}")

    # Every method named above, each topology's own way; the sync backends' return replies,
    # the async twins' are coroutine functions.
    send: Callable[..., Any]
    send_many: Callable[..., Any]
    run_script: Callable[..., Any]
    acknowledged: Callable[..., Any]
    run_then_wait: Callable[..., Any]
    wait: Callable[..., Any]
    drop_stale: Callable[..., Any]
