"""The reader of live semaphores, beside ``locks.py``'s of locks: list them with ``SCAN``
(their holders' keys, ``...{tag}:s``), read each one's holders and waiters in one round trip,
and force-release one permit. The admin page and ``manage.py redis_locks semaphores`` use it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..backends import backend_of
from ..backends.drivers import run
from ..backends.wire import execute
from ..conf import lock_settings
from ..core import flows
from ..core.permits import PermitKeys
from ..primitives.keys import namespace, permit_keys
from ..primitives.semaphore import Semaphore, SemaphoreState, read_state
from ..signals import lock_force_released
from .locks import glob_escape
from .records import LockInfo, lock_info, text

__all__ = [
    "SemaphoreInfo",
    "force_release_permit",
    "get_semaphore",
    "iter_semaphores",
    "semaphore_info",
]

logger = logging.getLogger("django_redis_lock")

_SCAN_COUNT = 500


@dataclass(frozen=True)
class SemaphoreInfo:
    """A semaphore as Redis has it now. ``limit``: the limit its oldest holder took its permit
    under (holders that disagree, in a rolling deploy, each keep their own); ``holders``: each
    permit's owner record, oldest first (``token`` is what :func:`force_release_permit`
    takes); ``waiting``: how many are queued."""

    name: str
    limit: int
    holders: tuple[LockInfo, ...]
    waiting: int

    @property
    def group(self) -> str:
        """Its metrics group, as its oldest holder's record has it."""
        return self.holders[0].group

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "limit": self.limit, "waiting": self.waiting, "group": self.group,
            "holders": [holder.as_dict() for holder in self.holders],
        }  # fmt: skip


def semaphore_info(
    keys: PermitKeys, state: SemaphoreState, name: str | None = None
) -> SemaphoreInfo | None:
    """What ``state`` (``semaphores.read_state``) says of the semaphore whose keys are
    ``keys``: None when no permit of it is held. ``name``: when known (else read from its key
    or records)."""
    permits = state.permits()
    if not permits:
        return None  # free (its keys expire with the last lease), or not written by us
    base = keys.holders[: -len(":s")]  # the key the semaphore is named by (primitives/keys.py)
    holders = tuple(
        lock_info(base, permit.as_lease(), int(state.ends[permit.token] - state.now))
        for permit in permits
    )
    # Unknown (a key SCAN found): a readable name is in its key, any other in each record,
    # and lock_info reads either.
    name = name or holders[0].name
    return SemaphoreInfo(name, permits[0].limit, holders, state.queued)


def get_semaphore(name: str, *, using: str | None = None) -> SemaphoreInfo | None:
    """The semaphore ``name`` as held now, or None when no permit of it is held."""
    alias = using or lock_settings.CACHE_ALIAS
    keys = permit_keys(name, alias)
    return semaphore_info(keys, read_state(backend_of(alias), keys), name)


def iter_semaphores(
    match: str | None = None, *, using: str | None = None
) -> Iterator[SemaphoreInfo]:
    """The semaphores with a permit held now, those whose name contains ``match`` if given.
    None in quorum mode (semaphores do not support it)."""
    alias = using or lock_settings.CACHE_ALIAS
    backend = backend_of(alias)
    if not backend.queues:  # quorum mode, which semaphores do not support: none held
        return
    pattern = glob_escape(namespace(alias)) + "{*}:s"
    for _, target in backend.servers():
        cursor = 0
        while True:
            cursor, found = execute(target, "SCAN", cursor, "MATCH", pattern, "COUNT", _SCAN_COUNT)
            for key in map(text, found):
                keys = PermitKeys.of(key[: -len(":s")])
                try:
                    info = semaphore_info(keys, read_state(backend, keys), None)
                except ResponseError as exc:  # a key of ours of another type: not ours to list
                    logger.debug("Not a semaphore: %s (%s)", key, exc)
                    continue
                if info is not None and (not match or match in info.name):
                    yield info
            if int(cursor) == 0:
                break


def force_release_permit(
    name: str, token: str, *, using: str | None = None, by: str | None = None
) -> bool:
    """Give back the permit ``token`` of semaphore ``name`` (from :func:`get_semaphore`), as
    its holder's release would: the first waiter is handed it. Returns False, freeing nothing,
    when that permit is not held (any more). The former holder's renewal then reports it lost.
    Sends ``lock_force_released`` (``sender=Semaphore``)."""
    alias = using or lock_settings.CACHE_ALIAS
    keys = permit_keys(name, alias)
    info = get_semaphore(name, using=alias)
    owner = (
        next((holder for holder in info.holders if holder.token == token), None) if info else None
    )
    released = run(flows.release(keys, token, ""), backend_of(alias))
    if released < 0:
        return False
    lock_force_released.send(
        sender=Semaphore, name=name, token=token, owner=owner.as_dict() if owner else None, by=by
    )
    return True
