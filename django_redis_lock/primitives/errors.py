"""The errors a caller gets: when Redis failed an operation on a lock, the cause in its words
(a lost connection, a write too few replicas confirmed, a command the server refused), and
what to do about it; and when a hold was found lost."""

from __future__ import annotations

import logging

from redis.exceptions import ResponseError

from ..backends.acl import (
    KEY_REFUSED,
    LUA_SCRIPTING,
    needed_for,
    refusal_text,
    refused_command,
)
from ..core.durations import readable
from ..core.flows import Unconfirmed, WaitRefused
from ..exceptions import CommandRefused, LockBackendError, LockError, LockLost, LockNotOwned
from ..links import docs_page
from .holds import Hold

__all__ = ["backend_error", "command_refused", "exit_error", "lost_error"]

logger = logging.getLogger("django_redis_lock")


def backend_error(
    name: str, action: str, exc: BaseException, replica_timeout: float
) -> LockBackendError:
    """The error a caller gets when Redis failed ``action`` on lock ``name``."""
    if isinstance(exc, Unconfirmed) and isinstance(exc.acknowledged, WaitRefused):
        return command_refused(name, action, "WAIT", exc.acknowledged.reason)
    refused = refused_command(exc) if isinstance(exc, ResponseError) else None
    if refused is not None:
        return command_refused(name, action, refused, str(exc))
    if isinstance(exc, Unconfirmed):
        return LockBackendError(
            f"Lock {name!r} was taken on the primary but only {exc.acknowledged} of "
            f"the {exc.replicas} replicas required (DJANGO_REDIS_LOCK_MIN_REPLICAS) "
            f"confirmed it within {readable(replica_timeout)}, so it was released "
            "again: a failover now could have handed it to a second holder.",
            name=name,
        )
    return LockBackendError(
        f"Could not {action} lock {name!r}: {type(exc).__name__}: {exc}", name=name
    )


def command_refused(name: str, action: str, command: str, reply: str) -> CommandRefused:
    """The error for a command the server refused (``reply``: its error reply) while it
    ``action``-ed lock ``name``: what needs the command, and what to do."""
    needed = needed_for(command) or "the locks"
    if command == KEY_REFUSED:
        what = "access to one of its keys: the user's ACL key patterns must cover the locks' keys"
        command_name = None
    else:
        what = f"the command {command}, which {needed} needs"
        command_name = command
    if needed == LUA_SCRIPTING and "unknown command" in reply.lower():
        advice = (
            "This server runs no Lua (a Valkey built without its Lua module, or a service "
            "that disables scripting): the locks cannot run on it."
        )
    elif command == "WAIT":
        advice = (
            "Allow WAIT for the locks' Redis user, or, on a service that has no WAIT, set "
            "DJANGO_REDIS_LOCK_MIN_REPLICAS = 0."
        ) + (" The lease it had taken was given back." if action == "acquire" else "")
    else:
        advice = (
            "Allow it for the locks' Redis user: `manage.py redis_locks acl` prints the ACL "
            f"rule the locks need ({docs_page('servers.md')})."
        )
    return CommandRefused(
        f"Could not {action} lock {name!r}: the server refused {what} "
        f"({refusal_text(reply)}). {advice}",
        name=name,
        command=command_name,
        needed_for=needed,
    )


def lost_error(name: str, reason: str | None) -> LockLost:
    """The error for a hold of lock ``name`` found lost (``reason``: why)."""
    return LockLost(f"Lock {name!r} was lost while held: {reason}.", name=name)


def exit_error(name: str, hold: Hold | None, exc: BaseException | None, error: LockError) -> None:
    """A release at the end of a ``with`` block on lock ``name`` (``hold``: what it held, if
    anything) failed with ``error``: say so without hiding ``exc``, the block's own error."""
    if exc is not None:
        logger.exception("Could not release lock %r after an error", name)
    elif isinstance(error, LockNotOwned) and hold is not None:
        raise lost_error(name, hold.lost_reason) from error
    else:
        raise error
