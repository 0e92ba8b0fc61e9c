"""A simulated client: a program (a generator of the core's requests, ``workloads.py``) and
where it stands. The simulation (``simulation.py``) moves it on; nothing here does I/O.

A client is *ready* (its next request waits to be sent), *parked* (a ``Block`` on its wake-up
list: woken when something arrives there, or when the block's time is up), *sleeping* (a
``Sleep``, or not arrived yet), *done*, or *crashed* (it never runs again).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from django_redis_lock.core.requests import Block, Request, Sleep
from django_redis_lock.primitives.strays import Strays

__all__ = ["NOTHING", "Client", "wake_time"]

NOTHING = object()  # a block sent without a script first: its reply is the popped element only


def wake_time(now_us: int, seconds: float) -> int:
    """When a wait of ``seconds`` from ``now_us`` ends: on a whole simulated millisecond (a
    key's expiry is in whole ms; see ``Simulation.clock``), and at least one later."""
    return (now_us + max(1, round(seconds * 1e6)) + 999) // 1000 * 1000


@dataclass(eq=False)
class Client:
    name: str
    start: Callable[[Client], Generator[Request, Any, None]]
    timer_us: int  # when a parked or sleeping client wakes (its arrival, at first)
    state: str = "sleeping"
    program: Generator[Request, Any, None] | None = None
    request: Request | None = None
    wake_key: str | None = None
    first_reply: Any = NOTHING
    inbox: list[str | None] = field(default_factory=list)
    broken: BaseException | None = None  # thrown in when it next runs (its connection died)
    paused_until_us: int = 0
    paused_while_acquiring: bool = False
    deadline_us: int | None = None  # while acquiring: when its wait ends
    strays: Strays = field(default_factory=Strays)  # this client's process's (holds.Strays)
    notes: list[str] = field(default_factory=list)
    outcome: Any = None  # its last acquisition's

    def paused(self, now_us: int) -> bool:
        return self.paused_until_us > now_us

    def runnable(self, now_us: int) -> bool:
        """Whether it can take a step now, without time passing."""
        if self.paused(now_us):
            return False
        if self.state == "ready":
            return True
        if self.state == "parked":
            return bool(self.inbox) or self.broken is not None or self.timer_us <= now_us
        return self.state == "sleeping" and self.timer_us <= now_us

    def waiting_until(self) -> int | None:
        """When it wakes by itself (None: never, or it does not wait)."""
        if self.state in ("parked", "sleeping"):
            return max(self.timer_us, self.paused_until_us)
        if self.state == "ready" and self.paused_until_us:
            return self.paused_until_us
        return None

    def resume(self, now_us: int, reply: Any = None, error: BaseException | None = None) -> None:
        """Send ``reply`` (or throw ``error``) into the program; it stops at its next request."""
        self.wake_key, self.first_reply, self.inbox, self.broken = None, NOTHING, [], None
        try:
            if self.program is None:
                self.program = self.start(self)
                request = next(self.program)
            elif error is not None:
                request = self.program.throw(error)
            else:
                request = self.program.send(reply)
        except StopIteration:
            self.state, self.request = "done", None
            return
        self.request = request
        if type(request) is Sleep:
            self.state, self.timer_us = "sleeping", wake_time(now_us, request.seconds)
        else:
            self.state = "ready"

    def park(self, request: Block, seconds: float, now_us: int, first_reply: Any) -> None:
        self.state, self.wake_key, self.first_reply = "parked", request.key, first_reply
        self.timer_us = wake_time(now_us, seconds)
        self.inbox = []

    def wake_up(self) -> Any:
        """What its block returns: the popped element (None: the time was up)."""
        message = self.inbox[0] if self.inbox else None
        return message if self.first_reply is NOTHING else (self.first_reply, message)

    def crash(self) -> None:
        self.state = "crashed"

    @property
    def finished(self) -> bool:
        return self.state in ("done", "crashed")
