"""asyncio under the scheduler: an event loop per simulated process, on simulated time.

A process's asyncio clients are tasks of one :class:`SimulatedEventLoop`, run by one actor
(``threads.py``), as an ASGI server's event loop runs many requests in one thread. The loop is
asyncio's own (its tasks, its timers, ``wait_for``, cancellation); only two of its parts are
the simulation's:

- its clock, :meth:`SimulatedEventLoop.time`, is the scheduler's: ``asyncio.sleep``, the
  library's reply budgets and its blocking waits run out on simulated time;
- its selector, :class:`SimulatedSelector`: when the loop has nothing ready to run, it blocks
  the actor (``threads.Wait``) until a reply it waits for arrives on one of its links, its
  next timer is due, or the scheduler wakes it to cancel one of its tasks (a fault:
  :meth:`SimulatedEventLoop.cancel`). The cancellation is delivered where that task is
  suspended, which is any ``await`` of the library's code the schedule reaches: between a
  request sent and its reply, in a blocking wait, in a hand-off.

:class:`SimulatedAsyncConnection` is the ``redis.asyncio`` twin of ``network.py``'s
connection: the library's async client for a cache of the world is made with it
(:func:`async_twin`, in place of ``backends/twins.py``'s ``twin``, which carries a real
connection class over).
"""

from __future__ import annotations

import asyncio
import math
import selectors
from typing import Any

import redis.asyncio
from redis.asyncio.connection import Connection as AsyncConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import network as simulated_network
from .threads import Wait, current_actor

__all__ = ["SimulatedAsyncConnection", "SimulatedEventLoop", "async_twin"]


class SimulatedSelector(selectors.BaseSelector):
    """The loop's selector: its real file descriptors (the loop's self-pipe) are polled, never
    waited on; waiting is the actor's, on the scheduler."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.real = selectors.DefaultSelector()
        self.loop: SimulatedEventLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.real.unregister(fileobj)

    def get_map(self) -> Any:
        return self.real.get_map()

    def close(self) -> None:
        self.real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if not self.loop.settle() and timeout != 0:
            now = self.scheduler.now_us
            until = None if timeout is None else now + max(1, math.ceil(timeout * 1e6))
            actor = current_actor()
            assert actor is not None, "a simulated event loop runs in a simulated thread"
            actor.block(Wait(until_us=until, links=tuple(self.loop.readers), loop=self.loop))
            self.loop.settle()
        return self.real.select(0)


class SimulatedEventLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is the scheduler's and whose waits are its actor's."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        # The links its tasks wait on for a reply: link -> the future their reply completes.
        self.readers: dict[Any, asyncio.Future[None]] = {}
        self.clients: list[asyncio.Task[Any]] = []  # the tasks a fault may cancel
        self.cancelling: list[asyncio.Task[Any]] = []
        selector = SimulatedSelector(scheduler)
        super().__init__(selector)
        selector.loop = self
        self._clock_resolution = 1e-6  # (the simulated clock counts microseconds)

    def time(self) -> float:
        return float(self.scheduler.now_us / 1e6)

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:
        """Run ``func`` at once, in the loop's own thread: an executor's thread would run
        outside the simulation. (asgiref's ``sync_to_async`` comes here: the async guards run
        what may need the database in it.) The loop's other tasks wait meanwhile, where an
        executor would let them run: fewer interleavings, but none that cannot happen (the
        executor's thread may well finish before the loop runs again)."""
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as error:  # (as an executor's future carries it)
            future.set_exception(error)
        return future

    def cancel(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task`` where it is suspended, when the loop's actor runs next (called by
        the scheduler, which then makes that actor ready)."""
        self.cancelling.append(task)

    def settle(self) -> bool:
        """In the loop's thread: deliver the cancellations asked for and complete the reads
        whose replies came. Whether anything became ready to run."""
        moved = False
        cancelling, self.cancelling = self.cancelling, []
        for task in cancelling:
            moved = task.cancel() or moved
        now = self.scheduler.now_us
        for link, future in list(self.readers.items()):
            if link.readable(now) and not future.done():
                future.set_result(None)
                moved = True
        return moved

    async def read(self, link: Any, timeout: float | None) -> Any:
        """The next reply on ``link`` (``network.Network.read`` for a task)."""
        if not link.readable(self.scheduler.now_us):
            future = self.create_future()
            self.readers[link] = future
            try:
                await asyncio.wait_for(future, timeout)
            except asyncio.TimeoutError:
                pass
            finally:
                self.readers.pop(link, None)
        if link.readable(self.scheduler.now_us) and link.replies:
            return link.replies.popleft()
        if link.dead:
            raise RedisConnectionError("simulated: the connection was cut")
        raise RedisTimeoutError("simulated: no reply in time")


class SimulatedAsyncConnection(AsyncConnection):
    """A ``redis.asyncio`` connection whose socket is the simulation's network."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.link: Any = None

    @property
    def is_connected(self) -> bool:
        return self.link is not None and not self.link.dead

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        """The pool's, as it lends the connection: one that was cut is made anew (as
        ``connection.SimulatedConnection.connect``)."""
        if self.link is not None and self.link.dead:
            await self.disconnect()
        self._linked()

    def _linked(self) -> None:
        self.link = simulated_network.current().link_for(self.link, self.host, self.port)

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        await self.connect()

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        if self.link is not None:
            network = simulated_network.current_or_none()
            if network is not None:
                network.close(self.link)
            self.link = None

    async def check_health(self) -> None:
        return None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._linked()
        try:
            simulated_network.current().send(self.link, simulated_network.packed(command))
        except BaseException:
            await self.disconnect()
            raise

    async def can_read_destructive(self) -> bool:
        self._linked()
        return bool(self.link.readable(simulated_network.current().scheduler.now_us))

    async def can_read(self) -> bool:  # (redis-py 8's pool asks this)
        return await self.can_read_destructive()

    async def read_response(
        self, disable_decoding: bool = False, timeout: float | None = None, *,
        disconnect_on_error: bool = True, push_request: bool = False,
    ) -> Any:  # fmt: skip
        if self.link is None:
            raise RedisConnectionError("simulated: read on a closed connection")
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimulatedEventLoop), "an async client outside a simulated loop"
        limit = self.socket_timeout if timeout is None else timeout
        try:
            reply = await loop.read(self.link, limit)
        except BaseException:
            if disconnect_on_error:
                await self.disconnect()
            raise
        if isinstance(reply, ResponseError):
            raise reply
        return reply


def async_twin(client: Any, *args: Any, **kwargs: Any) -> Any:
    """``backends.twins.twin`` for the world's caches: an asyncio client of the same server,
    with the same socket timeout, over :class:`SimulatedAsyncConnection`."""
    settings = client.connection_pool.connection_kwargs
    pool = redis.asyncio.ConnectionPool(
        connection_class=SimulatedAsyncConnection,
        host=settings["host"], port=settings["port"],
        socket_timeout=settings.get("socket_timeout"),
    )  # fmt: skip
    return redis.asyncio.Redis(connection_pool=pool)
