"""This process as a waiter elsewhere judges it (``core/dead_holders.py``): where it runs, its
record in Redis, and what ``/proc`` says of another process.

A process writes its record once per Redis (alias) before its first acquisition there, and again
at an acquisition ``RECORD_AGAIN`` later; a record that cannot be written (an ACL that
forbids it, a server that refuses) costs nothing but the early end of this process's leases
should it die: their leases then end by themselves, as they always did.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from redis.exceptions import RedisError

from ...backends.clients import LockAlias
from ...core.dead_holders import RECORD_AGAIN, RECORD_SECONDS, ProcessRecord
from .. import owners
from ..keys import process_key

__all__ = ["here", "record_args", "recorded", "started"]

logger = logging.getLogger("django_redis_lock")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except OSError:
        return None


def _place() -> str | None:
    """This kernel's boot and this process's PID namespace (None: no ``/proc`` to tell)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    if not boot:
        return None
    return f"{boot.strip()}/{namespace.st_dev}:{namespace.st_ino}"


_here = _place()


def here() -> str | None:
    """Where this process runs (``ProcessRecord.place``), or None: a process elsewhere's pid
    cannot be looked up from here, nor this one's from there."""
    return _here


def started(pid: int) -> str | None:
    """When process ``pid`` of this PID namespace started, in clock ticks since boot; None
    when there is no such process, or it has exited and waits to be reaped (a zombie)."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # "pid (comm) state ... starttime ...": comm may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


class _Recorded:
    """When this process last wrote its record, per alias (monotonic)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[LockAlias, float] = {}

    def due(self, alias: LockAlias) -> bool:
        """Whether the record should be written (again) before this acquisition: a dict
        lookup on every acquisition after the first."""
        at = self._at.get(alias)
        return _here is not None and (at is None or time.monotonic() - at > RECORD_AGAIN)

    def done(self, alias: LockAlias, reply: Any) -> None:
        """The write of the record (:func:`record_args`) came back with ``reply``: a
        ``RedisError`` is logged once and not tried again for a while."""
        if isinstance(reply, RedisError):
            logger.debug("Could not write this process's record: %s", reply)
        with self._lock:
            self._at[alias] = time.monotonic()

    def clear(self) -> None:
        self._lock = threading.Lock()
        self._at = {}


recorded = _Recorded()


def record_args(alias: LockAlias) -> tuple[Any, ...]:
    """The command that writes this process's record for ``alias``."""
    assert _here is not None
    record = ProcessRecord(_here, owners.pid, started(owners.pid) or "0")
    return ("SET", process_key(alias, owners.process_id), record.encode(), "EX", RECORD_SECONDS)


# A forked child is another process: its own id (``owners.py``) and its own record.
os.register_at_fork(after_in_child=recorded.clear)
