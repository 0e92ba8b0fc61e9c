"""The machine the simulated processes share, as the watch for dead holders sees it.

Every simulated process runs on one host: each has a pid and a start time, and the watch of
each (``primitives/background/dead_holders.py``, its own thread: an actor of its process)
judges the others by them, as on one Linux machine. What the watch asks of the operating
system is answered here, on the scheduler:

- ``process_records.started(pid)``: the start time of a process that has not crashed;
- its ``os``: ``getpid()`` (the running process's), a wake-up ``pipe()`` (``write``, ``read``,
  ``close``) and ``pidfd_open(pid)``, made readable the moment the process crashes;
- its selectors module: a selector over those, whose ``select`` blocks the watch's actor
  until one is readable or its time is up (a condition the host notifies on a write or a
  crash).

So the watch's own code runs: the sightings, the record read, the pidfd, the lease ended by
``release.lua``, all under the schedule, and a dead holder's replacement is checked for
liveness (``liveness.py``).
"""

from __future__ import annotations

import os
import selectors
import types
from dataclasses import dataclass, field
from typing import Any

from .threads import SimulatedCondition, current_actor

__all__ = ["SimulatedHost"]

FIRST_PID = 1000
FIRST_FD = 10_000


@dataclass(eq=False)
class SimulatedHost:
    scheduler: Any
    processes: list[Any]
    selecting: SimulatedCondition = field(default_factory=SimulatedCondition)
    _next_fd: int = FIRST_FD
    _pipes: dict[int, int] = field(default_factory=dict)  # write end -> read end
    _unread: dict[int, int] = field(default_factory=dict)  # read end -> bytes in it
    _pidfds: dict[int, Any] = field(default_factory=dict)  # pidfd -> its process

    def pid_for(self, index: int) -> int:
        return FIRST_PID + index

    def _process(self, pid: int) -> Any:
        return next((p for p in self.processes if p.pid == pid), None)

    def started(self, pid: int) -> str | None:
        """``process_records.started``: when ``pid`` started, None when it is not running."""
        process = self._process(pid)
        return None if process is None or process.crashed else f"{process.started_us}"

    def died(self, process: Any) -> None:
        """``process`` crashed: its pidfds are readable now."""
        self.selecting.notify_all()

    def readable(self, fd: int) -> bool:
        if fd in self._unread:
            return self._unread[fd] > 0
        process = self._pidfds.get(fd)
        return process is not None and process.crashed

    # -- the watch's os ----------------------------------------------------------------------

    def os_module(self) -> Any:
        stand_in = types.SimpleNamespace(**vars(os))
        stand_in.getpid = self._getpid
        stand_in.pipe = self._pipe
        stand_in.write = self._write
        stand_in.read = self._read
        stand_in.close = self._close
        stand_in.set_blocking = lambda fd, blocking: None
        stand_in.pidfd_open = self._pidfd_open
        return stand_in

    def selectors_module(self) -> Any:
        stand_in = types.SimpleNamespace(**vars(selectors))
        stand_in.DefaultSelector = lambda: _HostSelector(self)
        return stand_in

    def _getpid(self) -> int:
        actor = current_actor()
        process = actor.process if actor is not None else self.scheduler.process
        return int(process.pid)

    def _fd(self) -> int:
        self._next_fd += 1
        return self._next_fd

    def _pipe(self) -> tuple[int, int]:
        read, write = self._fd(), self._fd()
        self._pipes[write] = read
        self._unread[read] = 0
        return read, write

    def _write(self, fd: int, data: bytes) -> int:
        self._unread[self._pipes[fd]] += len(data)
        self.selecting.notify_all()
        return len(data)

    def _read(self, fd: int, count: int) -> bytes:
        taken = min(count, self._unread[fd])
        self._unread[fd] -= taken
        return b"!" * taken

    def _close(self, fd: int) -> None:
        self._pidfds.pop(fd, None)
        self._unread.pop(fd, None)
        self._pipes.pop(fd, None)

    def _pidfd_open(self, pid: int) -> int:
        process = self._process(pid)
        if process is None or process.crashed:
            raise ProcessLookupError(pid)
        fd = self._fd()
        self._pidfds[fd] = process
        return fd


class _HostSelector:
    """The default selector of the standard library, over the host's pipes and pidfds."""

    def __init__(self, host: SimulatedHost) -> None:
        self.host = host
        self.keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fd: int, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self.keys[fd] = selectors.SelectorKey(fd, fd, events, data)
        return key

    def unregister(self, fd: int) -> selectors.SelectorKey:
        return self.keys.pop(fd)

    def _ready(self) -> list[tuple[selectors.SelectorKey, int]]:
        return [
            (key, selectors.EVENT_READ) for fd, key in self.keys.items() if self.host.readable(fd)
        ]  # fmt: skip

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._ready()
        if not ready and (timeout is None or timeout > 0):
            self.host.selecting.wait(timeout)
            ready = self._ready()
        return ready

    def close(self) -> None:
        self.keys.clear()
