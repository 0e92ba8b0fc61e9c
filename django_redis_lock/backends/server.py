"""The backends: each carries out the core's requests for one topology (see ``__init__.py``).

The requests go out through ``commands.py`` (each sent once, on a pooled connection) and the
scripts through ``scripts.py``. A backend is chosen once per client, by its class, and kept as
long as the client is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import ClusterError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..commands import (
    adrop_stale_connections,
    aexecute,
    aexecute_many,
    drop_stale_connections,
    execute,
    execute_many,
)
from ..conf import PREFIX
from ..connection import LockAlias, lock_client
from ..core.requests import Block, Command, Eval, Failover, Pipeline, Request
from ..quorum import AsyncQuorumClient, QuorumClient
from ..scripts import EXTEND, JOIN, RELEASE, TAKE, Script
from ..waits import arun_then_wait, await_wake, run_then_wait, wait_for_wake

__all__ = [
    "AsyncClusterBackend",
    "AsyncQuorumBackend",
    "AsyncServerBackend",
    "Backend",
    "ClusterBackend",
    "QuorumBackend",
    "ServerBackend",
    "async_backend_for",
    "backend_for",
    "backend_of",
]

SCRIPTS: dict[str, Script] = {script.name: script for script in (TAKE, JOIN, RELEASE, EXTEND)}


def _grants(reply: Any) -> bool:
    """A reply worth confirming by replicas: a lease granted or extended."""
    return bool(reply == 1 or (isinstance(reply, list) and reply[0] == 1))


def _silent(give_back: Eval | None) -> Callable[[], Sequence[Any]] | None:
    if give_back is None:
        return None
    script = SCRIPTS[give_back.script]
    return lambda: script.command(give_back.keys, give_back.args)


def _shortened(request: Block, reply: Any) -> tuple[float, bool]:
    """How long a block sent after ``request.first`` lasts, given its reply (``at_most``)."""
    limit = request.at_most(reply) if request.at_most is not None else request.seconds
    if limit < request.seconds:
        return max(limit, 0.001), True
    return request.seconds, request.exact


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

    @staticmethod
    def unreachable(error: BaseException) -> bool:
        """No use sending anything more now (telling the queue we leave, say)."""
        return isinstance(error, RedisTimeoutError)


class ServerBackend(Backend):
    """One Redis server, directly or through Sentinel (a ``redis.Redis`` client)."""

    def perform(self, request: Request) -> Any:
        kind = type(request)
        if kind is Command:
            assert isinstance(request, Command)
            return execute(
                self.client, *request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
            )  # fmt: skip
        if kind is Eval:
            assert isinstance(request, Eval)
            script = SCRIPTS[request.script]
            if request.replicas:
                return script.call_acknowledged(
                    self.client, request.keys, request.args, request.replicas,
                    request.replica_timeout_ms, wanted=_grants,
                )  # fmt: skip
            return script(
                self.client, request.keys, request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
            )  # fmt: skip
        if kind is Block:
            assert isinstance(request, Block)
            if request.first is not None:
                return self._run_then_wait(request, request.first)
            return wait_for_wake(self.client, request.key, request.seconds, exact=request.exact)
        if kind is Pipeline:
            assert isinstance(request, Pipeline)
            return execute_many(self.client, request.commands)
        if kind is Failover:
            assert isinstance(request, Failover)
            drop_stale_connections(self.client, request.key)
            return None
        raise TypeError(f"{type(self).__name__} cannot carry out {request!r}")

    def _run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        script = SCRIPTS[first.script]
        command = ("EVALSHA", script.sha, len(first.keys), *first.keys, *first.args)
        silent = _silent(first.give_back)
        for attempt in (1, 2):
            try:
                return run_then_wait(
                    self.client, command, request.key, request.seconds, exact=request.exact,
                    reply_timeout=first.reply_timeout, if_silent=silent, at_most=request.at_most,
                )  # fmt: skip
            except NoScriptError:
                if attempt == 2:
                    raise
                execute(self.client, "SCRIPT", "LOAD", script.source)
        raise AssertionError("unreachable")


class ClusterBackend(ServerBackend):
    """Redis Cluster: each command goes to the node of its key (all keys of one lock share a
    hash tag, so one node), sent once, MOVED and ASK followed."""

    def perform(self, request: Request) -> Any:
        if type(request) is Pipeline:
            assert isinstance(request, Pipeline)
            # One by one, through the Cluster client, which follows MOVED and ASK (a slot
            # being moved): a pipeline on one node's connection could not. Failure paths only.
            replies: list[Any] = []
            for command in request.commands:
                try:
                    replies.append(execute(self.client, *command))
                except ResponseError as error:
                    replies.append(error)
            return replies
        return super().perform(request)

    def _run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        # In two round trips: the script through the Cluster client, which follows MOVED and
        # ASK (a slot being moved), then the wait on the node's own connection.
        reply = super().perform(first)
        seconds, exact = _shortened(request, reply)
        return reply, wait_for_wake(self.client, request.key, seconds, exact=exact)


class QuorumBackend(ServerBackend):
    """Quorum mode (``quorum/``): each request goes to every server, answered as the majority
    does. No queue: a waiter looks again after a short random delay."""

    queues = False


class AsyncServerBackend(Backend):
    """:class:`ServerBackend` for a ``redis.asyncio`` client."""

    async def perform(self, request: Request) -> Any:
        kind = type(request)
        if kind is Command:
            assert isinstance(request, Command)
            return await aexecute(
                self.client, *request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
            )  # fmt: skip
        if kind is Eval:
            assert isinstance(request, Eval)
            script = SCRIPTS[request.script]
            if request.replicas:
                return await script.acall_acknowledged(
                    self.client, request.keys, request.args, request.replicas,
                    request.replica_timeout_ms, wanted=_grants,
                )  # fmt: skip
            return await script.acall(
                self.client, request.keys, request.args,
                reply_timeout=request.reply_timeout, if_silent=_silent(request.give_back),
            )  # fmt: skip
        if kind is Block:
            assert isinstance(request, Block)
            if request.first is not None:
                return await self._run_then_wait(request, request.first)
            return await await_wake(self.client, request.key, request.seconds, exact=request.exact)
        if kind is Pipeline:
            assert isinstance(request, Pipeline)
            return await aexecute_many(self.client, request.commands)
        if kind is Failover:
            await adrop_stale_connections(self.client)
            return None
        raise TypeError(f"{type(self).__name__} cannot carry out {request!r}")

    async def _run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        script = SCRIPTS[first.script]
        command = ("EVALSHA", script.sha, len(first.keys), *first.keys, *first.args)
        silent = _silent(first.give_back)
        for attempt in (1, 2):
            try:
                return await arun_then_wait(
                    self.client, command, request.key, request.seconds, exact=request.exact,
                    reply_timeout=first.reply_timeout, if_silent=silent, at_most=request.at_most,
                )  # fmt: skip
            except NoScriptError:
                if attempt == 2:
                    raise
                await aexecute(self.client, "SCRIPT", "LOAD", script.source)
        raise AssertionError("unreachable")


class AsyncClusterBackend(AsyncServerBackend):
    """:class:`ClusterBackend` for ``redis.asyncio.cluster.RedisCluster``."""

    async def _run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        reply = await self.perform(first)
        seconds, exact = _shortened(request, reply)
        return reply, await await_wake(self.client, request.key, seconds, exact=exact)

    async def perform(self, request: Request) -> Any:
        if isinstance(request, Eval) and request.replicas:
            raise ImproperlyConfigured(
                "DJANGO_REDIS_LOCK_MIN_REPLICAS is not supported by the async API on a Redis "
                "Cluster yet: use the sync API (or sync_to_async) for these locks."
            )
        return await super().perform(request)


class AsyncQuorumBackend(AsyncServerBackend):
    """:class:`QuorumBackend` for asyncio (each request runs in a worker thread)."""

    queues = False


_backends: weakref.WeakKeyDictionary[Any, Backend] = weakref.WeakKeyDictionary()


def backend_for(client: Any) -> ServerBackend:
    """The backend for a client of ``connection.lock_client()``, chosen once by its class."""
    backend = _backends.get(client)
    if backend is None:
        if isinstance(client, QuorumClient):
            backend = QuorumBackend(client)
        elif isinstance(client, RedisCluster):
            backend = ClusterBackend(client)
        else:
            backend = ServerBackend(client)
        _backends[client] = backend
    assert isinstance(backend, ServerBackend)
    return backend


_by_alias: dict[LockAlias, ServerBackend] = {}


def backend_of(alias: LockAlias) -> ServerBackend:
    """The backend of the locks of ``alias`` (``connection.lock_client``), kept until the
    settings change."""
    backend = _by_alias.get(alias)
    if backend is None:
        backend = _by_alias[alias] = backend_for(lock_client(alias))
    return backend


@receiver(setting_changed)
def _forget_backends(*, setting: str, **kwargs: Any) -> None:
    if setting == "CACHES" or setting.startswith(PREFIX):
        _by_alias.clear()


def async_backend_for(client: Any) -> AsyncServerBackend:
    """:func:`backend_for` for a client of ``connection.async_lock_client()``."""
    if isinstance(client, AsyncQuorumClient):
        return AsyncQuorumBackend(client)
    backend = _backends.get(client)
    if backend is None:
        if isinstance(client, AsyncRedisCluster):
            backend = AsyncClusterBackend(client)
        else:
            backend = AsyncServerBackend(client)
        _backends[client] = backend
    assert isinstance(backend, AsyncServerBackend)
    return backend
