"""The exceptions django-redis-lock raises.

Every one derives from :class:`LockError`, so ``except LockError`` catches any lock failure
while leaving programming errors (``TypeError``, ``ValueError``) and configuration errors
(``ImproperlyConfigured``) to surface.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .core.durations import readable

__all__ = [
    "CommandRefused",
    "DuplicateTask",
    "LockBackendError",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
]


class LockError(Exception):
    """Base class of every lock failure; ``name`` is the lock's readable name, if known."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class LockNotAcquired(LockError):
    """The wait ran out while someone else held the lock.

    ``ttl`` is how many seconds the holder's lease had left when we gave up (``None`` if
    unknown), and ``owner`` the holder's owner record (host, pid, thread, label, and
    ``acquired_at``: seconds since the epoch by the Redis server's clock), so the message can
    say who is in the way instead of just "timeout". ``by_caller``: the holder is the very
    thread or asyncio task that asked, through another ``Lock`` object of the same name (a lock
    that is not re-entrant waits for itself in vain).
    """

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None = None,
        owner: Mapping[str, Any] | None = None,
        waited: float | None = None,
        by_caller: bool = False,
    ) -> None:
        self.ttl = ttl
        self.owner = dict(owner) if owner is not None else None
        self.waited = waited
        self.by_caller = by_caller
        super().__init__(self._describe(name), name=name)

    def _describe(self, name: str) -> str:
        message = f"Could not acquire lock {name!r}"
        if self.waited is not None:
            message += f" within {readable(self.waited)}"
        if self.by_caller:
            caller = "task" if self.owner and self.owner.get("task") else "thread"
            return (
                f"{message}: this {caller} holds it already, through another Lock object, and "
                "waits for itself in vain. Make the Lock objects of this name with "
                "reentrant=True to take it again (levels of one hold)."
            )
        if self.owner:
            holder = "/".join(
                str(self.owner[part]) for part in ("host", "pid", "thread") if part in self.owner
            )
            if holder:
                message += f": held by {holder}"
            if self.owner.get("label"):
                message += f" ({self.owner['label']})"
            if isinstance(self.owner.get("acquired_at"), int | float):
                since = datetime.fromtimestamp(self.owner["acquired_at"], tz=timezone.utc)
                message += f" since {since:%Y-%m-%d %H:%M:%S} UTC"
        if self.ttl is not None:
            message += f", lease ends in {readable(self.ttl)}"
        return message


class LockNotOwned(LockError):
    """An operation needed our lease (release, extend) but we do not hold it.

    Either we never acquired, or our lease ended and possibly someone else holds the lock now;
    in both cases nothing of anyone else's was touched.
    """


class LockLost(LockError):
    """Our lease ended while we believed we held the lock (expired, deleted, or force-released).

    Work done since may have overlapped another holder's: treat its results with suspicion.
    """


class LockBackendError(LockError):
    """Redis could not be reached, or did not answer in time.

    The original redis-py exception is chained as ``__cause__``.
    """


class CommandRefused(LockBackendError):
    """The server refused a command the locks need: a Redis ACL without it, a managed service
    that renamed or disabled it, a server without Lua scripting.

    ``command`` is the refused command (``"WAIT"``, ``"EVALSHA"``; None when the ACL refused a
    key, not a command), ``needed_for`` what needs it. ``manage.py redis_locks acl`` prints the
    ACL rule the locks need (docs/servers.md).
    """

    def __init__(
        self, message: str, *, name: str | None = None, command: str | None, needed_for: str
    ) -> None:
        super().__init__(message, name=name)
        self.command = command
        self.needed_for = needed_for


class DuplicateTask(LockNotAcquired):
    """A task guard found the same task (by its guard key) queued or running already.

    ``task_id`` is that task's id (None when something other than a task guard holds the key),
    ``queued`` whether it still waits in its queue (else it runs), and ``ttl`` how many seconds
    its hold has left: a running task's is renewed while it runs, a queued one's ends when the
    task starts or after the guard's ``guard_queued_timeout``.
    """

    def __init__(
        self,
        name: str,
        *,
        task: str = "",
        task_id: str | None = None,
        queued: bool = False,
        ttl: float | None = None,
        owner: Mapping[str, Any] | None = None,
    ) -> None:
        self.task = task
        self.task_id = task_id
        self.queued = queued
        super().__init__(name, ttl=ttl, owner=owner)

    def _describe(self, name: str) -> str:
        if not self.task:
            # Rebuilt from its message alone (``DuplicateTask(message)``: a pickle, a task
            # result backend): keep the message.
            return name
        state = "queued" if self.queued else "running"
        message = f"Task {self.task} is {state} already"
        if self.task_id is not None:
            message += f" as {self.task_id}"
        message += f" (guard key {name!r})"
        if self.ttl is not None:
            ends = "unless it starts" if self.queued else "unless renewed"
            message += f"; its hold ends in {readable(self.ttl)} {ends}"
        return message
