"""What a flow (``flows.py``) asks of Redis. A backend (``backends/``) carries each out, once,
and sends back the reply, or throws the error into the flow. (Slotted, not frozen: several are
made per acquisition, and a frozen dataclass costs several times more to build. Nobody changes
a request once it is made.)"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

__all__ = ["Block", "Command", "Eval", "Failover", "Flow", "Pipeline", "Request", "Sleep"]


@dataclass(slots=True)
class Eval:
    """Run a script of ``backends/scripts.py`` (by its name, e.g. ``"join"``).

    ``reply_timeout``: give up on the reply after that many seconds. ``give_back``: when no
    reply came in time (or the caller was cancelled), send this (one script, or several: one
    per lease the request may have granted) after it on the same connection, unread: Redis
    runs it after the first whenever it runs that one. ``replicas``: after a reply
    that ``grants``, ``WAIT`` for that many replicas (``replica_timeout_ms``); the reply is then
    ``(reply, replicas that acknowledged)``. ``cleanup``: sent while unwinding after an error or
    a cancellation (the async driver carries it out even when the caller is cancelled again)."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    reply_timeout: float | None = None
    give_back: Eval | tuple[Eval, ...] | None = None
    replicas: int = 0
    replica_timeout_ms: int = 0
    cleanup: bool = False


@dataclass(slots=True)
class Command:
    """One plain command (``args``), with ``reply_timeout`` and ``give_back`` as for Eval."""

    args: tuple[Any, ...]
    reply_timeout: float | None = None
    give_back: Eval | tuple[Eval, ...] | None = None
    cleanup: bool = False


@dataclass(slots=True)
class Pipeline:
    """Several commands on one key's server in one round trip; error replies come back in
    place, as exceptions."""

    commands: tuple[tuple[Any, ...], ...]
    cleanup: bool = False


@dataclass(slots=True)
class Block:
    """Block until something is pushed on ``key`` (the reply is what was popped) or
    ``seconds`` pass (None). ``exact``: the time matters (cut it to the millisecond).
    ``first``: a script to run just before, in the same round trip where the backend can; the
    reply is then ``(its reply, what was popped)``. ``after_first``: called with ``first``'s
    reply as soon as it is read, before the block goes on: how long the block may last after
    all (e.g. until the holder's lease ends: the block is then cut short, exactly). It may also
    note what the reply says (that we now wait in line), which must not wait for the block."""

    key: str
    seconds: float
    exact: bool
    first: Eval | None = None
    after_first: Callable[[Any], float] | None = None


@dataclass(slots=True)
class Sleep:
    """Wait, doing nothing (the driver sleeps: ``time.sleep`` or ``asyncio.sleep``)."""

    seconds: float


@dataclass(slots=True)
class Failover:
    """The server that holds ``key`` may be a primary a failover replaced: find where the
    primary is now, and drop the connections to the old one."""

    key: str


Request = Eval | Command | Pipeline | Block | Sleep | Failover

# An operation: yields requests, is sent their replies, returns its outcome.
Flow = Generator[Request, Any, Any]
