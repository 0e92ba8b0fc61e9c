"""The first lock a process takes on a Redis says, once, whether that Redis may evict it.

A Redis with ``maxmemory`` and an evicting ``maxmemory-policy`` (``allkeys-lru``, common on a
cache's Redis) can drop a held lease under memory pressure, and let a second holder in while
the first works. The admin's page, ``redis_locks list`` and ``check --deploy`` (W003) say so
when asked; this says it in the log of every process that takes locks there: a WARNING, once
per process and alias, at its first acquisition there.

The cost: one ``INFO memory`` to every server of the alias at once (``backends/eviction.py``),
one round trip, once per process and alias, whatever it finds (an unreachable server is not
asked again). The sync API sends it just before that first acquisition, as it writes the
process's record: before, so that nothing is held meanwhile (a short lease's first renewal never
waits for a connection behind it). The async API sends it in a daemon thread, on the sync
client's connections, which neither the acquisition nor ``asyncio.run()`` waits for: the event
loop never blocks. It is advice: nothing it meets (a refusal, a silent server, a bad reply)
reaches the lock's caller.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..backends.clients import LockAlias
from ..backends.eviction import read_evictions
from ..conf import PREFIX

__all__ = ["aadvise", "advise", "advised"]

logger = logging.getLogger("django_redis_lock")


class _Advised:
    """The aliases whose servers this process has asked (or is asking) about eviction."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aliases: set[LockAlias] = set()

    def due(self, alias: LockAlias) -> bool:
        """Whether to ask now: a set lookup on every acquisition after the first."""
        return alias not in self._aliases

    def claim(self, alias: LockAlias) -> bool:
        """Ask for ``alias`` (True) unless another thread did already: once per alias."""
        with self._lock:
            if alias in self._aliases:
                return False
            self._aliases.add(alias)
            return True

    def clear(self) -> None:
        self._lock = threading.Lock()
        self._aliases = set()


advised = _Advised()


def advise(alias: LockAlias) -> None:
    """Log a WARNING for each server of ``alias`` that may evict lock keys (an INFO for one
    whose policy could not be read), once per process and alias. Never raises."""
    if advised.claim(alias):
        _tell(alias)


def aadvise(alias: LockAlias) -> None:
    """:func:`advise` for the async API: in a daemon thread of its own, not waited for
    (claimed here, so that the next acquisitions do not ask again). Not the event loop's
    executor: ``asyncio.run()`` waits for that one as it ends, and a Redis that stops
    answering mid-handshake would hold it there for a socket timeout."""
    if advised.claim(alias):
        threading.Thread(
            target=_tell, args=(alias,), name="django-redis-lock-eviction-advice", daemon=True
        ).start()


def _tell(alias: LockAlias) -> None:
    try:
        evictions = read_evictions(alias)
    except Exception:  # advice: whatever goes wrong here must not reach a lock's caller
        logger.debug("Could not read the eviction policy of %r's servers", alias, exc_info=True)
        return
    for eviction in evictions:
        if eviction.evicts:
            logger.warning("%s", eviction.advice)
        elif eviction.advice is not None:
            logger.info("%s", eviction.advice)


# A forked child is another process, with a log of its own.
os.register_at_fork(after_in_child=advised.clear)


@receiver(setting_changed)
def _forget_advice(*, setting: str, **kwargs: Any) -> None:
    # Another cache, another server: ask again (tests; a deployment's settings do not change).
    if setting == "CACHES" or setting.startswith(PREFIX):
        advised.clear()
