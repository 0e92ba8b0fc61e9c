"""The two drivers of a flow (``core/flows.py``): one blocking, one for asyncio. A dozen lines
each, and nothing else differs between the sync and the async lock API. And the flat release
(``core/uncontended.py``): its one request, then the wake-ups it asks for, if any."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from ..core.flows import Flow
from ..core.layout import KeyLayout
from ..core.requests import Eval, Pipeline, Sleep
from ..core.uncontended import released

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


async def arun(flow: Flow, backend: Any) -> Any:
    """:func:`run` for asyncio. Requests the flow sends while cleaning up (after an error or a
    cancellation) are shielded from a further cancellation."""
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
                await asyncio.sleep(request.seconds)
            elif getattr(request, "cleanup", False):
                reply = await _shielded(backend.perform(request))
            else:
                reply = await backend.perform(request)
        except BaseException as exc:
            error = exc


async def _shielded(awaitable: Any) -> Any:
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # Cancelled again while cleaning up: the request goes on, unwatched; the flow is told
        # it failed (its clean-up steps expect that of any request).
        raise ConnectionError("cancelled while cleaning up") from None


def release(request: Eval, keys: KeyLayout, backend: Any) -> tuple[int, str]:
    """Send a release (``uncontended.release_request``) and wake the waiters it was handed to
    without expecting them; returns its code and the first waiter it handed to or woke ('':
    none; ``uncontended.released``)."""
    code, wake, first = released(keys, backend.perform(request))
    if wake:
        with contextlib.suppress(Exception):  # (only how soon they know depends on it)
            backend.perform(Pipeline(wake, cleanup=True))
    return code, first


async def arelease(request: Eval, keys: KeyLayout, backend: Any) -> tuple[int, str]:
    """:func:`release` for asyncio; the wake-ups are shielded from a cancellation."""
    code, wake, first = released(keys, await backend.perform(request))
    if wake:
        with contextlib.suppress(Exception):
            await _shielded(backend.perform(Pipeline(wake, cleanup=True)))
    return code, first
