"""The two drivers of a flow (``core/flows.py``): one blocking, one for asyncio. A dozen lines
each, and nothing else differs between the sync and the async lock API. And the flat release
(``core/uncontended.py``): its one request, then the wake-ups it asks for, if any."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.flows import Flow
from ..core.layout import KeyLayout
from ..core.requests import Command, Eval, Failover, Pipeline, Sleep
from ..core.uncontended import released
from .inflight import carry, carrying

__all__ = ["arelease", "arun", "release", "run"]


def run(flow: Flow, backend: Any) -> Any:
    """Run ``flow`` to its end on ``backend``; returns its outcome, or raises its error."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value
        reply = error = None
        try:
            if type(request) is Sleep:
                time.sleep(request.seconds)
            else:
                reply = backend.perform(request)
        except BaseException as exc:  # thrown into the flow, which may clean up and re-raise
            error = exc


# What a backend carries to its end however the caller is cancelled (``inflight.carry``): the
# core's requests to Redis, each a round trip. Waits are cut at once; a group's steps
# (``primitives/group_steps.py``) run in the caller's task, as each member's own call.
_CARRIED = (Command, Eval, Pipeline, Failover)


async def arun(
    flow: Flow, backend: Any, *, give_back: Callable[[Any], Awaitable[None]] | None = None
) -> Any:
    """:func:`run` for asyncio. A request to Redis is carried to its end however the caller
    is cancelled meanwhile (a cancellation waits for the reply in flight, ``inflight.py``), and
    its reply goes to the flow; the cancellation is thrown into the flow at its next step instead
    of that step (unless it is a clean-up step: those are carried out too), so that it steps out
    of the line. A flow that ends all the same hands its outcome (a lease granted, say) to
    ``give_back``, before the cancellation goes on. Blocking waits (``Block``, ``Sleep``) are
    cut at once."""
    reply: Any = None
    error: BaseException | None = None
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            request = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as stop:
            if cancelled is None:
                return stop.value
            if give_back is not None:
                await give_back(stop.value)
            raise cancelled from None
        except BaseException as failure:
            if cancelled is not None and failure is not cancelled:
                raise cancelled from failure
            raise
        reply = error = None
        if cancelled is not None and not getattr(request, "cleanup", False):
            error = cancelled  # told now, in this step's stead
            continue
        try:
            if type(request) is Sleep:
                await asyncio.sleep(request.seconds)
            elif isinstance(request, _CARRIED) and not carrying():
                done = await carry(backend.perform(request))
                reply, error = done.reply, done.error
                cancelled = cancelled or done.cancelled
            else:
                reply = await backend.perform(request)
        except BaseException as exc:
            error = exc


def release(request: Eval, keys: KeyLayout, backend: Any) -> tuple[int, str]:
    """Send a release (``uncontended.release_request``) and wake the waiters it was handed to
    without expecting them; returns its code and the first waiter it handed to or woke ('':
    none; ``uncontended.released``)."""
    code, wake, first = released(keys, backend.perform(request))
    if wake is not None:
        with contextlib.suppress(Exception):  # (only how soon they know depends on it)
            backend.perform(wake)
    return code, first


async def arelease(request: Eval, keys: KeyLayout, backend: Any) -> tuple[int, str]:
    """:func:`release` for asyncio. Its callers carry it to its end (``inflight.carry``): a
    release cut by a cancellation would keep the lock for a lease, or leave the waiters it was
    handed to asleep."""
    code, wake, first = released(keys, await backend.perform(request))
    if wake is not None:
        with contextlib.suppress(Exception):
            await backend.perform(wake)
    return code, first
