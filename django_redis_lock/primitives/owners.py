"""Who an acquisition belongs to: its owner (the asyncio task running the code, else the
thread), this process (its pid, its id, the machine it runs on) and the tokens it makes, and
the owner record a lease carries to say so.

A forked child is another process: its own pid, its own id, random bytes of its own
(``os.register_at_fork`` below), so that nothing of its parent's passes for its.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import socket
import threading
import weakref
from typing import Any

from ..core.lease import JOB_SEPARATOR, OwnerRecord

__all__ = [
    "HOST",
    "OwnerRecords",
    "current_owner",
    "job_token",
    "new_identity",
    "new_token",
    "owner_description",
    "owner_record",
    "pid",
    "process_alive",
    "process_id",
]

#: This machine's name, as owner records give it.
HOST = socket.gethostname()

#: This process' pid, kept up to date across fork() rather than asked of the kernel on every
#: acquire and release: a hold whose ``pid`` differs is a forked child's copy of its parent's.
pid = os.getpid()

# Random bytes for tokens, taken from the OS a few kilobytes at a time rather than with a
# system call per acquisition; emptied at fork, so that a child never reuses its parent's.
_random = bytearray()
_random_lock = threading.Lock()


def _process_id() -> str:
    """This process's id, which its tokens start with (``core/dead_holders.py``): 48 random bits,
    8 URL-safe characters, never a leading ``-`` (a command line would take a token for an
    option: ``redis_locks release-permit NAME -x...``)."""
    made = base64.urlsafe_b64encode(secrets.token_bytes(6)).decode()
    return made if made[0] != "-" else "_" + made[1:]


#: This process's id (new in a forked child), the first PROCESS_ID_LENGTH characters of its
#: tokens: a waiter finds this process's record by it (``background/process_records.py``).
process_id = _process_id()


def new_token() -> str:
    """A new owner token: this process's id, then 48 random bits of its own (``secrets``'
    source), 16 URL-safe characters in all."""
    global _random
    with _random_lock:
        if len(_random) < 6:
            _random = bytearray(secrets.token_bytes(3072))
        chunk = bytes(_random[-6:])
        del _random[-6:]
    return process_id + base64.urlsafe_b64encode(chunk).decode()


def process_alive(pid: int | None) -> bool:
    """Whether process ``pid`` of this machine runs (a zombie not reaped yet does not)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/status") as status:
            return "\nState:\tZ" not in status.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def job_token(job_id: str) -> str:
    """An owner token for ``job_id``: the id, then random (another run of the same job, a
    redelivered copy, must not pass for this one)."""
    return f"{job_id}{JOB_SEPARATOR}{new_token()}"


def current_owner() -> object:
    """The asyncio task running this code, else the current thread: who holds an acquisition."""
    # _get_running_loop, not current_task(): outside a loop that raises, and raising on every
    # sync acquire and release is a measurable share of their cost.
    loop = asyncio._get_running_loop()
    task = asyncio.current_task(loop) if loop is not None else None
    return task if task is not None else threading.current_thread()


def owner_description(owner: object) -> dict[str, str]:
    """How an owner is named in the lock's owner record."""
    if isinstance(owner, asyncio.Task):
        return {"thread": threading.current_thread().name, "task": owner.get_name()}
    name = getattr(owner, "name", None)  # not getattr(..., str(owner)): repr() is costly
    return {"thread": name if name is not None else str(owner)}


class OwnerRecords:
    """The encoded owner records of one lock's acquisitions, built once per owner, process and
    lease: the same for every acquisition a long-lived Lock object makes from one thread (a
    thread may be renamed: checked too, cheaply, since this runs on every acquisition)."""

    def __init__(
        self, *, label: str | None, name: str | None, guard: str | None, group: str | None = None
    ) -> None:
        self.label, self.name, self.guard, self.group = label, name, guard, group
        self._cache: weakref.WeakKeyDictionary[object, tuple[tuple[Any, ...], str]] = (
            weakref.WeakKeyDictionary()
        )

    def encoded(self, owner: object, lease: float) -> str:
        if isinstance(owner, asyncio.Task):
            names: tuple[Any, ...] = (owner.get_name(), threading.current_thread().name)
        else:
            names = (getattr(owner, "name", None),)
        key = (pid, names, lease)
        cached = self._cache.get(owner)
        if cached is not None and cached[0] == key:
            return cached[1]
        record = owner_record(
            owner, lease, label=self.label, name=self.name, guard=self.guard, group=self.group
        ).encode()
        self._cache[owner] = (key, record)
        return record


def owner_record(
    owner: object, lease: float, *, label: str | None, name: str | None, guard: str | None,
    group: str | None = None,
) -> OwnerRecord:  # fmt: skip
    """The owner record of an acquisition by ``owner`` in this process (``name``: the
    readable name, when the key holds only a hash of it)."""
    described = owner_description(owner)
    return OwnerRecord(
        lease=lease, pid=os.getpid(), host=HOST, thread=described["thread"],
        task=described.get("task"), label=label, name=name, guard=guard, group=group,
    )  # fmt: skip


def new_identity() -> None:
    """This process becomes another: its pid read again, a new id, random bytes of its own.
    Run in a forked child; a simulation (``tests/simulation/``) runs it for each process it
    simulates."""
    global pid, process_id, _random, _random_lock
    pid = os.getpid()
    process_id = _process_id()
    _random, _random_lock = bytearray(), threading.Lock()


os.register_at_fork(after_in_child=new_identity)
