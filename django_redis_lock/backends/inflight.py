"""A request in flight is carried to its end: what an asyncio cancellation waits for.

Cancelling a task that waits for a reply (``asyncio.wait_for`` running out, ``task.cancel()``,
an ASGI server whose client went away) must not leave in Redis what the request did without
anyone knowing it: a lease taken by nobody, for a whole lease. So a request once sent is not cut
by the caller's cancellation: it runs in a task of its own (:func:`carry`), the cancellation
waits for its reply (one round trip; at most ``CANCEL_GRACE`` if Redis is slow to answer), and
then goes on, after the caller has given back what the request took (:func:`carried`) or kept
its books (a release: done, and known to be).

Why a task of its own, and not ``asyncio.wait_for`` or ``asyncio.shield`` alone: on Python
3.10 and 3.11, ``wait_for`` runs its awaitable in a task and, cancelled just as that task
finished, drops the task's result (a lock granted, and nobody told); a shield that is not
waited for returns before the reply is read. Blocking waits (``BLPOP``) are not carried: they
are cut at once, and the flow steps out of the line (``core/flows.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core.durations import readable

__all__ = ["CANCEL_GRACE", "Carried", "carried", "carry", "carrying", "no_reply"]

# How long a cancelled caller still waits for the reply of a request already sent, seconds.
# Past it, the request is cut: on one server its give-back follows it on its connection
# (``wire.aexecute``'s ``if_silent``), which Redis runs right after the request, whenever that
# runs. Against a server that answers, a cancellation waits one round trip.
CANCEL_GRACE = 1.0

# Set in the task of a carried exchange (and the tasks it starts), for :func:`carrying`.
_CARRYING: ContextVar[bool] = ContextVar("django_redis_lock_carrying", default=False)


def no_reply(reply_timeout: float) -> RedisTimeoutError:
    return RedisTimeoutError(f"Redis did not answer within {readable(reply_timeout)}")


@dataclass(slots=True)
class Carried:
    """How a carried exchange ended: its reply or its error, the caller's cancellation if one
    came meanwhile (the caller's to raise, once it has done what the reply asks), and whether
    the exchange was cut (no reply in time: its task cancelled)."""

    reply: Any = None
    error: BaseException | None = None
    cancelled: asyncio.CancelledError | None = None
    cut: bool = False

    def result(self) -> Any:
        """The reply, or the exchange's error raised."""
        if self.error is not None:
            raise self.error
        return self.reply


async def carry(
    exchange: Coroutine[Any, Any, Any],
    reply_timeout: float | None = None,
    *,
    grace: float | None = CANCEL_GRACE,
) -> Carried:
    """Run ``exchange`` (a request and its reply) to its end in a task of its own, whatever
    happens to the caller meanwhile. Its error is ``TimeoutError`` (``no_reply``) when no reply
    came within ``reply_timeout``, or within ``grace`` of the caller's cancellation: then the
    exchange is cut (its task cancelled, so that it sends its give-back). ``grace=None``: an
    exchange that bounds its own time (a quorum's worker thread, which a cut would not stop)."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(_marked(exchange))
    done = Carried()
    limit = None if reply_timeout is None else loop.time() + reply_timeout
    while not task.done():
        timeout = None if limit is None or done.cut else max(limit - loop.time(), 0.0)
        try:
            await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError as error:
            if done.cut:  # cancelled again while it cleans up: no longer waited for
                done.cancelled = done.cancelled or error
                break
            if done.cancelled is None:
                done.cancelled = error
                if grace is not None:
                    limit = min(limit or math.inf, loop.time() + grace)
            continue
        if not task.done():
            done.cut = True
            task.cancel()  # then waited for: it sends its give-back, it does not wait for it
    if not task.done() or task.cancelled():
        done.error = no_reply(reply_timeout if reply_timeout is not None else grace or 0.0)
        if task.cancelled():
            # Maybe cancelled before it ever ran (the loop shutting down cancels every
            # task): nothing was sent, and the exchange is closed here rather than left to the
            # garbage collector's "never awaited" warning. (A no-op on one that ran: it is
            # over. One still running, no longer waited for, is left to run.)
            exchange.close()
    else:
        try:
            done.reply = task.result()
        except BaseException as error:
            done.error = error
    return done


def carrying() -> bool:
    """Whether this code runs inside a carried exchange (:func:`carry`): cut only by its grace
    running out, so a request in it needs no task of its own (each costs about 15 µs)."""
    return _CARRYING.get()


async def _marked(exchange: Coroutine[Any, Any, Any]) -> Any:
    _CARRYING.set(True)  # (in the task's own copy of the context: the caller's is untouched)
    return await exchange


async def carried(
    exchange: Coroutine[Any, Any, Any],
    *,
    reply_timeout: float | None = None,
    give_back: Callable[[], Awaitable[Any]] | None = None,
    gives_back_when_cut: bool = False,
    grace: float | None = CANCEL_GRACE,
) -> Any:
    """:func:`carry` ``exchange`` for a caller with nothing to do after it but to give back
    what it took: when the caller was cancelled meanwhile, ``give_back()`` (carried too, for
    ``CANCEL_GRACE`` at most; its errors ignored: the lease then ends by itself) runs before
    the cancellation goes on, unless the exchange was cut and ``gives_back_when_cut`` (on one
    server, its give-back follows it on its connection already)."""
    if carrying():  # already carried as a whole: nothing to cut it but its grace
        return await _within(exchange, reply_timeout)
    done = await carry(exchange, reply_timeout, grace=grace)
    if done.cancelled is None:
        return done.result()
    if give_back is not None and not (done.cut and gives_back_when_cut):
        with contextlib.suppress(Exception):
            (await carry(_awaited(give_back), CANCEL_GRACE)).result()
    raise done.cancelled


async def _awaited(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()


async def _within(exchange: Coroutine[Any, Any, Any], reply_timeout: float | None) -> Any:
    """``exchange``, raising ``no_reply`` past ``reply_timeout`` (its task then cut, as a
    cancellation cuts it)."""
    if reply_timeout is None:
        return await exchange
    try:
        return await asyncio.wait_for(exchange, reply_timeout)
    except asyncio.TimeoutError:
        raise no_reply(reply_timeout) from None
