"""The two drivers of a flow (``core/flows.py``): one blocking, one for asyncio. A dozen lines
each, and nothing else differs between the sync and the async lock API."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..core.flows import Flow
from ..core.requests import Sleep

__all__ = ["arun", "run"]


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
