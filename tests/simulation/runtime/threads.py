"""Threads run one at a time, in the order the schedule chooses, on simulated time.

Every thread of a schedule (a client's, and each one our library starts: the renewal watchdog,
its batches) is a real thread, so that what the library reads of threads (``current_thread()``,
``is_alive()``) is true; but only one of them runs at a time, as the scheduler hands it the
baton (:meth:`Actor.resume`), until it *blocks*: it waits for a reply (``network.py``), sleeps,
or waits on a condition. Then the baton goes back to the scheduler, which decides, from the
schedule's choices, what happens next. Between two blocks a thread runs plain Python, so a
schedule replays exactly from its seed.

:func:`simulated_runtime` puts this in place for one process (the simulation's own: ``make
simulate`` and the suite's share run in processes of their own): ``time.monotonic``,
``time.time`` and ``time.sleep`` read and wait on the simulated clock, ``threading.Thread``
makes actors, ``threading.Condition`` waits on the scheduler, in the library's modules that start
threads (:data:`THREADED`: their ``threading`` is a stand-in; the ``threading`` module itself is
left alone, as the baton is made of it). A ``threading.Lock`` stays real:
one held across a block would stall the schedule, which :meth:`Actor.resume` reports
(:class:`Stuck`) instead of hanging.
"""

from __future__ import annotations

import contextlib
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django_redis_lock.primitives import eviction
from django_redis_lock.primitives.background import dead_holders, renewal

__all__ = [
    "Actor",
    "Crashed",
    "Interrupted",
    "Scheduler",
    "SimulatedCondition",
    "SimulatedRLock",
    "SimulatedThread",
    "Stuck",
    "Wait",
    "current_actor",
    "simulated_runtime",
]

_RealThread = threading.Thread

# The library's modules that start threads or wait on conditions.
THREADED = (renewal, dead_holders, eviction)
_real_monotonic = time.monotonic
_real_time = time.time
_real_sleep = time.sleep

# How long (real seconds) the scheduler waits for an actor to block again: an actor that takes
# longer is stuck outside the simulation (a real lock held across a block, a real socket).
HANDOFF_SECONDS = 20.0


class Crashed(BaseException):
    """Raised in an actor whose process crashed: it runs no more of its code (its cleanup can
    reach no server: ``network.py`` refuses a crashed process' requests)."""


class Interrupted(KeyboardInterrupt):
    """A sync caller interrupted where it blocked (a signal handler's ``KeyboardInterrupt``, a
    ``SystemExit`` from a worker's shutdown): a fault the schedule chooses.

    ``before_read``: it came after the request was sent and before the read of its reply
    began (a signal lands between any two bytecodes), so the connection's own clean-up on a
    failed read never ran: the reply is still to come on it."""

    def __init__(self, message: str, *, before_read: bool = False) -> None:
        super().__init__(message)
        self.before_read = before_read


class Stuck(AssertionError):
    """An actor did not block again in time: it waits outside the simulation."""


@dataclass(eq=False)
class Wait:
    """What a blocked actor waits for: a reply on ``link`` (``network.Link``), a
    ``condition`` notified, a reply on any of ``links`` (an event loop's: ``aio.py``, whose
    ``loop`` it is), or only time; each until ``until_us`` at most (None: no time limit)."""

    until_us: int | None = None
    link: Any = None
    condition: Any = None
    notified: bool = False
    links: tuple[Any, ...] = ()
    loop: Any = None


class Actor:
    """One thread of the schedule, in one simulated process."""

    def __init__(
        self, scheduler: Scheduler, name: str, process: Any, target: Callable[[], Any],
        thread: _RealThread | None = None,
    ) -> None:  # fmt: skip
        self.scheduler = scheduler
        self.name = name
        self.process = process
        self.target = target
        self.wait: Wait | None = Wait(until_us=scheduler.now_us)  # (ready at once)
        self.done = False
        self.error: BaseException | None = None
        self.throw: BaseException | None = None  # raised where it blocked, when resumed
        self._go = threading.Semaphore(0)
        self.thread = thread or SimulatedThread(target=target, name=name, daemon=True)
        self.thread.actor = self  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<Actor {self.name}>"

    def start(self) -> None:
        _RealThread.start(self.thread)

    def main(self) -> None:
        """The thread's body (``SimulatedThread.run``)."""
        self._go.acquire()
        try:
            if self.throw is not None:
                error, self.throw = self.throw, None
                raise error
            self.target()
        except Crashed:
            pass
        except BaseException as error:  # (the scheduler decides what an escaped error means)
            self.error = error
        finally:
            self.done, self.wait = True, None
            self.scheduler.baton.release()

    # -- in the scheduler's thread ---------------------------------------------------------------

    def resume(self) -> None:
        """Let it run until it blocks again (or ends)."""
        self.wait = None
        self.scheduler.running = self
        self._go.release()
        if not self.scheduler.baton.acquire(timeout=HANDOFF_SECONDS):
            raise Stuck(f"{self.name} did not block again within {HANDOFF_SECONDS} s")
        self.scheduler.running = None

    def ready(self, now_us: int) -> bool:
        wait = self.wait
        if wait is None or self.done:
            return False
        if self.throw is not None or wait.notified:
            return True
        if wait.link is not None and wait.link.readable(now_us):
            return True
        if any(link.readable(now_us) for link in wait.links):
            return True
        return wait.until_us is not None and wait.until_us <= now_us

    # -- in its own thread -----------------------------------------------------------------------

    def block(self, wait: Wait) -> None:
        """Give the baton back until the scheduler resumes it; raises what it was told to
        (:class:`Crashed`, :class:`Interrupted`, a task's cancellation)."""
        self.wait = wait
        self.scheduler.baton.release()
        self._go.acquire()
        if self.throw is not None:
            error, self.throw = self.throw, None
            raise error


class Scheduler:
    """The clock and the actors of one schedule (``simulation.py`` decides their order)."""

    def __init__(self, now_us: int) -> None:
        self.now_us = now_us
        self.start_us = now_us
        self.actors: list[Actor] = []
        self.baton = threading.Semaphore(0)
        self.running: Actor | None = None
        self.process: Any = None  # the process whose actor runs (or that starts one)

    def monotonic(self) -> float:
        return self.now_us / 1e6

    def add(self, name: str, process: Any, target: Callable[[], Any], at_us: int) -> Actor:
        actor = Actor(self, name, process, target)
        actor.wait = Wait(until_us=at_us)
        self.actors.append(actor)
        actor.start()
        return actor


_scheduler: Scheduler | None = None


def current_actor() -> Actor | None:
    thread = threading.current_thread()
    return getattr(thread, "actor", None)


def _blocking(wait: Wait) -> None:
    actor = current_actor()
    if actor is None:
        raise RuntimeError("only a simulated thread may block on simulated time")
    actor.block(wait)


class SimulatedRLock:
    """``threading.RLock`` for actors, held across a block (redis-py's Cluster client holds
    one while it reads the slot map from a node): another actor that asks for it waits on the
    scheduler until it is released, where a real lock would stall the schedule."""

    def __init__(self) -> None:
        self._owner: Any = None
        self._count = 0
        self._released = SimulatedCondition()

    # How often a waiter looks again: the owner may be a thread of a process that crashed,
    # which never releases it (simulated processes share the client that holds the lock).
    LOOK_AGAIN = 0.01

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.current_thread()
        deadline = None if timeout < 0 else _monotonic() + timeout
        while not self._free_for(me):
            left = self.LOOK_AGAIN if deadline is None else deadline - _monotonic()
            if not blocking or left <= 0:
                return False
            self._released.wait(min(left, self.LOOK_AGAIN))
        self._owner = me
        self._count += 1
        return True

    def _free_for(self, me: Any) -> bool:
        if self._owner is None or self._owner is me:
            return True
        actor = getattr(self._owner, "actor", None)
        if actor is not None and actor.process is not None and actor.process.crashed:
            self._owner, self._count = None, 0  # (gone with its process, as its memory would)
            return True
        return False

    def release(self) -> None:
        assert self._owner is threading.current_thread(), "released by another thread"
        self._count -= 1
        if not self._count:
            self._owner = None
            self._released.notify()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _monotonic() -> float:
    assert _scheduler is not None
    return _scheduler.now_us / 1e6


def _time() -> float:
    assert _scheduler is not None
    return _scheduler.now_us / 1e6


def _sleep(seconds: float) -> None:
    assert _scheduler is not None
    _blocking(Wait(until_us=_scheduler.now_us + max(1, round(seconds * 1e6))))


class SimulatedThread(_RealThread):
    """``threading.Thread`` in a simulation: started as an actor of the process that starts
    it, ready at once; it runs when the scheduler says."""

    actor: Actor | None = None

    def start(self) -> None:
        if self.actor is not None:  # (an actor's own thread, started by Actor.start)
            _RealThread.start(self)
            return
        assert _scheduler is not None
        parent = current_actor()
        process = parent.process if parent is not None else _scheduler.process
        actor = Actor(_scheduler, self.name, process, self._simulated_target, thread=self)
        _scheduler.actors.append(actor)
        _RealThread.start(self)

    def _simulated_target(self) -> None:
        _RealThread.run(self)

    def run(self) -> None:
        assert self.actor is not None
        self.actor.main()


class SimulatedCondition:
    """``threading.Condition`` for actors: one runs at a time, so entering it takes nothing;
    ``wait`` blocks the actor until notified or its time is up."""

    def __init__(self, lock: Any = None) -> None:
        self._waiting: list[Wait] = []

    def __enter__(self) -> SimulatedCondition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def acquire(self, *args: Any) -> bool:
        return True

    def release(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> bool:
        assert _scheduler is not None
        until = None if timeout is None else _scheduler.now_us + max(1, round(timeout * 1e6))
        wait = Wait(until_us=until, condition=self)
        self._waiting.append(wait)
        try:
            _blocking(wait)
        finally:
            if wait in self._waiting:
                self._waiting.remove(wait)
        return wait.notified

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        result = predicate()
        while not result:
            if not self.wait(timeout):
                return predicate()
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        for wait in self._waiting[:n]:
            wait.notified = True
        del self._waiting[:n]

    def notify_all(self) -> None:
        self.notify(len(self._waiting))


@contextlib.contextmanager
def simulated_runtime(scheduler: Scheduler) -> Iterator[Scheduler]:
    """Time and threads of this process on ``scheduler`` while inside."""
    global _scheduler
    _scheduler = scheduler
    saved = (time.monotonic, time.time, time.sleep)
    time.monotonic, time.time, time.sleep = _monotonic, _time, _sleep  # type: ignore[assignment]
    stand_in = types.SimpleNamespace(**vars(threading))
    stand_in.Thread, stand_in.Condition = SimulatedThread, SimulatedCondition
    for module in THREADED:
        module.threading = stand_in  # type: ignore[attr-defined]
    try:
        yield scheduler
    finally:
        time.monotonic, time.time, time.sleep = saved  # type: ignore[assignment]
        for module in THREADED:
            module.threading = threading  # type: ignore[attr-defined]
        _scheduler = None
