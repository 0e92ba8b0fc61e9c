"""One Redis server, directly or through Sentinel (a ``redis.Redis`` client):
:class:`ServerBackend` and its async twin. The commands go out through ``wire.py`` (each sent
once, on a pooled connection), the scripts through ``scripts.py``, the waits through
``waits.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError
from redis.sentinel import SentinelConnectionPool

from ..core.renewal import RenewedLease
from ..core.requests import Block, Eval, Request
from .base import SCRIPTS, Backend, silent
from .renewal import extend_many, renew
from .scripts import RELEASE, Script
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

__all__ = ["AsyncServerBackend", "Server", "ServerBackend"]


class Server(NamedTuple):
    """One server that holds keys of ours: a name for people, and a plain client of it."""

    name: str
    client: Any


def server_name(client: Any) -> str:
    """``host:port`` (or the socket path) of a plain client, for people; through Sentinel, the
    name of the primary it asks for (its address may change)."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        return f"{pool.service_name} (Sentinel's primary)"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '')}"


# The first request of a backend loads this script first (one round trip, once): a server
# without Lua, or a user whose ACL refuses scripts, then fails at first use in one clear error,
# not after an uncontended acquisition (a plain SET NX) that no script can release or renew.
_FIRST_LOADED = RELEASE


class ServerBackend(Backend):
    """One Redis server, directly or through Sentinel (a ``redis.Redis`` client)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.perform = self._loading_first  # type: ignore[method-assign]
        self.send_request = self._loading_first_send  # type: ignore[method-assign]

    def _load_first(self, reply_timeout: float | None) -> None:
        # Bounded as the request itself is: an acquisition's wait holds against a silent Redis.
        self.send("SCRIPT", "LOAD", _FIRST_LOADED.source, reply_timeout=reply_timeout)
        # The class's own methods from now on (another thread may have dropped these first).
        self.__dict__.pop("perform", None)
        self.__dict__.pop("send_request", None)

    def _loading_first(self, request: Request) -> Any:
        self._load_first(getattr(request, "reply_timeout", None))
        return self.perform(request)

    def _loading_first_send(self, *args: Any, **options: Any) -> Any:
        self._load_first(options.get("reply_timeout"))
        return self.send_request(*args, **options)

    def send(
        self,
        *args: Any,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    ) -> Any:
        """One command, sent once (``wire.execute``)."""
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

    # The call is the reply (Backend.call: the mapping the async twin shares).
    perform = Backend.call

    # What the readers of live state and the watchdog ask of the topology.

    #: Quorum mode: how many of :meth:`servers` must answer for a read to be sure, each lock
    #: being on a majority of them. None: each key is on one server, which must answer.
    majority: int | None = None

    def servers(self) -> list[Server]:
        """The servers that hold our keys (what ``SCAN`` must visit): this one."""
        return [Server(server_name(self.client), self.client)]

    def server_of(self, key: str) -> Any:
        """A plain client of the server that holds ``key``."""
        return self.client

    def read_first(self, key: str, read: Callable[[Any], Any]) -> Any:
        """``read(server)`` on the server of ``key``; in quorum mode, on the first that answers
        with something (None: nothing there), as long as a majority answered."""
        return read(self.server_of(key))

    def copies(self) -> list[ServerBackend]:
        """One backend per independent copy of our data (quorum mode: one per server), for
        what each keeps on its own (the replay budgets)."""
        return [self]

    def incomplete(self, unreachable: Sequence[str]) -> str | None:
        """Why a listing that could not read the ``unreachable`` servers may miss locks, or
        None when it cannot. Here every server must answer: a listing raises instead."""
        return None

    def renew(self, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
        """Renew ``leases`` (to ``lengths`` ms each): 1, 0 (lost) or an error each."""
        return renew(self, leases, lengths)

    def extend_leases(self, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
        """Several locks' leases, renewed in one round trip (``extend_many.lua``)."""
        return extend_many(self.client, leases, lengths)

    def run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        """``first`` and the block after it, in one round trip on one connection."""
        script = SCRIPTS[first.script]
        command = ("EVALSHA", script.sha, len(first.keys), *first.keys, *first.args)
        if_silent = silent(first.give_back)
        for attempt in (1, 2):
            try:
                return run_then_wait(
                    self.client, command, request.key, request.seconds, exact=request.exact,
                    reply_timeout=first.reply_timeout, if_silent=if_silent,
                    after_first=request.after_first,
                )  # fmt: skip
            except NoScriptError:
                if attempt == 2:
                    raise
                self.send("SCRIPT", "LOAD", script.source)
        raise AssertionError("unreachable")


class AsyncServerBackend(Backend):
    """:class:`ServerBackend` for a ``redis.asyncio`` client."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.perform = self._loading_first  # type: ignore[method-assign]
        self.send_request = self._loading_first_send  # type: ignore[method-assign]

    async def _load_first(self, reply_timeout: float | None) -> None:
        await self.send("SCRIPT", "LOAD", _FIRST_LOADED.source, reply_timeout=reply_timeout)
        self.__dict__.pop("perform", None)
        self.__dict__.pop("send_request", None)

    async def _loading_first(self, request: Request) -> Any:
        await self._load_first(getattr(request, "reply_timeout", None))
        return await self.perform(request)

    async def _loading_first_send(self, *args: Any, **options: Any) -> Any:
        await self._load_first(options.get("reply_timeout"))
        return await self.send_request(*args, **options)

    async def send(
        self,
        *args: Any,
        reply_timeout: float | None = None,
        if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    ) -> Any:
        return await aexecute(self.client, *args, reply_timeout=reply_timeout, if_silent=if_silent)

    async def send_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        return await aexecute_many(self.client, commands)

    async def run_script(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], **options: Any
    ) -> Any:
        return await script.arun(self.send, keys, args, **options)

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
        return await self.call(request)

    async def run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        script = SCRIPTS[first.script]
        command = ("EVALSHA", script.sha, len(first.keys), *first.keys, *first.args)
        if_silent = silent(first.give_back)
        for attempt in (1, 2):
            try:
                return await arun_then_wait(
                    self.client, command, request.key, request.seconds, exact=request.exact,
                    reply_timeout=first.reply_timeout, if_silent=if_silent,
                    after_first=request.after_first,
                )  # fmt: skip
            except NoScriptError:
                if attempt == 2:
                    raise
                await self.send("SCRIPT", "LOAD", script.source)
        raise AssertionError("unreachable")
