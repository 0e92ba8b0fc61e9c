"""One Redis server, directly or through Sentinel: :class:`ServerBackend` and its async twin,
and :class:`Backend`, what every topology's backend shares (see ``__init__.py``).

A backend carries out the core's requests (``core/requests.py``) by a handful of methods that
each topology implements its own way (``send``, ``send_many``, ``run_script``,
``acknowledged``, ``wait``, ``drop_stale``, ``follow_primary``); ``perform`` maps a request
onto them, once for all. The commands go out through ``commands.py`` (each sent once, on a
pooled connection), the scripts through ``scripts.py``, the waits through ``waits.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ClusterError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

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
    Script,
)
from .waits import arun_then_wait, await_wake, run_then_wait, wait_for_wake
from .wire import (
    adrop_stale_connections,
    aexecute,
    aexecute_many,
    drop_stale_connections,
    execute,
    execute_many,
    follow_sentinel,
)

__all__ = [
    "SCRIPTS",
    "AsyncServerBackend",
    "Backend",
    "ServerBackend",
    "one_by_one",
    "shortened",
]

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
    )
}


def _grants(reply: Any) -> bool:
    """A reply worth confirming by replicas: a lease granted or extended."""
    return bool(reply == 1 or (isinstance(reply, list) and reply[0] == 1))


def _silent(give_back: Eval | None) -> Callable[[], Sequence[Any]] | None:
    if give_back is None:
        return None
    script = SCRIPTS[give_back.script]
    return lambda: script.command(give_back.keys, give_back.args)


def shortened(request: Block, reply: Any) -> tuple[float, bool]:
    """How long a block sent after ``request.first`` lasts, given its reply: ``after_first``
    is called with it (before the block, whose length it may shorten)."""
    limit = request.after_first(reply) if request.after_first is not None else request.seconds
    if limit < request.seconds:
        return max(limit, 0.001), True
    return request.seconds, request.exact


def one_by_one(send: Callable[..., Any], commands: Sequence[Sequence[Any]]) -> list[Any]:
    """``send_many`` where commands cannot share a round trip: each ``send``, error replies
    in place."""
    replies: list[Any] = []
    for command in commands:
        try:
            replies.append(send(*command))
        except ResponseError as error:
            replies.append(error)
    return replies


class Backend:
    """What every backend, sync or async, tells the flows about its topology."""

    queues = True  # waiters queue and are woken (quorum mode polls instead)

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


class ServerBackend(Backend):
    """One Redis server, directly or through Sentinel (a ``redis.Redis`` client)."""

    def send(
        self,
        *args: Any,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Any]] | None = None,
    ) -> Any:
        """One command, sent once (``commands.execute``)."""
        return execute(self.client, *args, reply_timeout=reply_timeout, if_silent=if_silent)

    def send_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Several commands in one round trip; error replies in place."""
        return execute_many(self.client, commands)

    def run_script(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], **options: Any
    ) -> Any:
        """``script``, loaded where it must be (``options``: :meth:`send`'s)."""
        return script.run(self.send, keys, args, **options)

    def acknowledged(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], replicas: int,
        timeout_ms: int, wanted: Callable[[Any], bool],
    ) -> tuple[Any, int]:  # fmt: skip
        """``script``, then ``WAIT`` for ``replicas`` on the same connection if ``wanted``."""
        return script.call_acknowledged(self.client, keys, args, replicas, timeout_ms, wanted)

    def wait(self, key: str, seconds: float, exact: bool) -> Any:
        """Block on the wake-up list ``key`` (``waits.wait_for_wake``)."""
        return wait_for_wake(self.client, key, seconds, exact=exact)

    def drop_stale(self, key: str) -> None:
        """The server of ``key`` may be a primary a failover replaced."""
        drop_stale_connections(self.client)

    def follow_primary(self) -> None:
        """Before a batch of renewals: renew where the primary is now (Sentinel)."""
        follow_sentinel(self.client.connection_pool)

    def perform(self, request: Request) -> Any:
        kind = type(request)
        if kind is Command:
            assert isinstance(request, Command)
            return self.send(
                *request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
            )  # fmt: skip
        if kind is Eval:
            assert isinstance(request, Eval)
            script = SCRIPTS[request.script]
            if request.replicas:
                return self.acknowledged(
                    script, request.keys, request.args, request.replicas,
                    request.replica_timeout_ms, _grants,
                )  # fmt: skip
            return self.run_script(
                script, request.keys, request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
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
            self.drop_stale(request.key)
            return None
        raise TypeError(f"{type(self).__name__} cannot carry out {request!r}")

    def run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        """``first`` and the block after it, in one round trip on one connection."""
        script = SCRIPTS[first.script]
        command = ("EVALSHA", script.sha, len(first.keys), *first.keys, *first.args)
        silent = _silent(first.give_back)
        for attempt in (1, 2):
            try:
                return run_then_wait(
                    self.client, command, request.key, request.seconds, exact=request.exact,
                    reply_timeout=first.reply_timeout, if_silent=silent,
                    after_first=request.after_first,
                )  # fmt: skip
            except NoScriptError:
                if attempt == 2:
                    raise
                self.send("SCRIPT", "LOAD", script.source)
        raise AssertionError("unreachable")


class AsyncServerBackend(Backend):
    """:class:`ServerBackend` for a ``redis.asyncio`` client."""

    async def send(
        self,
        *args: Any,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Any]] | None = None,
    ) -> Any:
        return await aexecute(self.client, *args, reply_timeout=reply_timeout, if_silent=if_silent)

    async def send_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        return await aexecute_many(self.client, commands)

    async def acknowledged(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], replicas: int,
        timeout_ms: int, wanted: Callable[[Any], bool],
    ) -> tuple[Any, int]:  # fmt: skip
        return await script.acall_acknowledged(
            self.client, keys, args, replicas, timeout_ms, wanted
        )

    async def wait(self, key: str, seconds: float, exact: bool) -> Any:
        return await await_wake(self.client, key, seconds, exact=exact)

    async def drop_stale(self, key: str) -> None:
        await adrop_stale_connections(self.client)

    async def perform(self, request: Request) -> Any:
        kind = type(request)
        if kind is Command:
            assert isinstance(request, Command)
            return await self.send(
                *request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
            )  # fmt: skip
        if kind is Eval:
            assert isinstance(request, Eval)
            script = SCRIPTS[request.script]
            if request.replicas:
                return await self.acknowledged(
                    script, request.keys, request.args, request.replicas,
                    request.replica_timeout_ms, _grants,
                )  # fmt: skip
            return await script.arun(
                self.send, request.keys, request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
            )  # fmt: skip
        if kind is Block:
            assert isinstance(request, Block)
            if request.first is not None:
                return await self.run_then_wait(request, request.first)
            return await self.wait(request.key, request.seconds, request.exact)
        if kind is Pipeline:
            assert isinstance(request, Pipeline)
            return await self.send_many(request.commands)
        if kind is Failover:
            assert isinstance(request, Failover)
            await self.drop_stale(request.key)
            return None
        raise TypeError(f"{type(self).__name__} cannot carry out {request!r}")

    async def run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        script = SCRIPTS[first.script]
        command = ("EVALSHA", script.sha, len(first.keys), *first.keys, *first.args)
        silent = _silent(first.give_back)
        for attempt in (1, 2):
            try:
                return await arun_then_wait(
                    self.client, command, request.key, request.seconds, exact=request.exact,
                    reply_timeout=first.reply_timeout, if_silent=silent,
                    after_first=request.after_first,
                )  # fmt: skip
            except NoScriptError:
                if attempt == 2:
                    raise
                await self.send("SCRIPT", "LOAD", script.source)
        raise AssertionError("unreachable")
