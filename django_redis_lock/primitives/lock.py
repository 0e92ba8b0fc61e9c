"""``Lock``: a distributed lock on Redis with a finite lease, an owner token and fair waiting.

    with Lock("reports:nightly", label="nightly report") as held:
        ...                                   # renewed in the background while inside

    lock = Lock("import:42", timeout=30, wait=0)
    if lock.acquire():                        # -> bool, does not block with wait=0
        try: ...
        finally: lock.release()               # only ever deletes our own lease

Nothing touches Redis until the first acquire. A free lock is taken with one ``SET NX PX``; a
waiter queues, blocks on its own wake-up list, and is handed the lease by the release, first
come first served (``core/flows.py`` decides each step, ``backends/`` carries it out; this
module keeps the holds). A ``Lock`` object may be shared between threads and asyncio tasks:
each holds (and may release) only its own acquisition.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from ..backends import backend_of
from ..backends.clients import LockAlias
from ..core.lease import held_by, job_id_checked
from ..core.requests import Command
from ..hints import check_names, keyword_names
from .claims import Claim
from .keys import LockKeys, lock_keys
from .leased import Leased
from .owners import current_owner

__all__ = ["LOCK_OPTIONS", "Claim", "Lock"]

logger = logging.getLogger("django_redis_lock")


class Lock(Leased):
    """A distributed lock named ``name``.

    ``timeout``: the lease in seconds. Not given: ``DJANGO_REDIS_LOCK_TIMEOUT``, renewed in the
    background while held (``DJANGO_REDIS_LOCK_AUTO_RENEW``). Given: not renewed unless
    ``auto_renew=True``. ``wait``: the longest wait in seconds for ``acquire()`` and ``with``
    (default ``DJANGO_REDIS_LOCK_WAIT``; ``0`` never blocks; ``float("inf")`` waits for ever).
    ``reentrant``: the same thread or task may acquire again (levels counted in the process).
    ``fencing``: each acquisition gets a strictly increasing ``fencing_token``. ``label``: a
    description for people, shown in the admin. ``using``: the cache alias, or a quorum: the
    name of one in ``DJANGO_REDIS_LOCK_QUORUMS``, or a list of cache aliases on independent
    servers (held while a majority holds it, see ``quorum/``). ``job_id``: the id of the job
    the lock is held for (a Celery task's, an RQ job's): each acquisition's owner token starts
    with it, so that another process (a worker's supervisor, after the job died) can release
    exactly that job's hold with ``registry.release_job(name, job_id)``; and an acquisition
    takes over the job's reservation (``reservations.reserve``, made when the job was queued) as if
    the lock were free. ``guard``: what kind of guard holds the lock (the task guards write
    their mode, ``"until_executed"``...), shown in the admin and ``redis_locks``. ``group``:
    what the metrics count it under (``"import:{feed_id}"``: a template, never an id); by
    default the name's leading parts (``core/labels.py``). ``fair=False``: a release leaves
    the lock free for whoever asks first (the releaser coming back, a newcomer) and wakes the
    first waiter to compete for it, rather than handing it to that waiter (a waiter that just
    lost that race is not woken again: it asks again on its own within 5 ms,
    ``LOST_RACE_RETRY_MS``, 25 ms on an idle server); a waiter that has waited 250 ms
    (``STARVATION_BOUND_MS``) is served next all the same. More acquisitions per second under
    heavy contention, at the price of order (Redisson's RLock beside RFairLock).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Lock:
        # Before __init__'s own TypeError: say which of our options another library's is.
        check_names(kwargs, "Lock()", takes=_KEYWORDS)
        return super().__new__(cls)

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        wait: float | None = None,
        auto_renew: bool | None = None,
        reentrant: bool = False,
        fencing: bool = False,
        label: str | None = None,
        using: str | Sequence[str] | None = None,
        job_id: str | None = None,
        guard: str | None = None,
        group: str | None = None,
        fair: bool = True,
    ) -> None:
        for flag, value in (("reentrant", reentrant), ("fencing", fencing), ("fair", fair)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be True or False, not {value!r}.")
        if guard is not None and not isinstance(guard, str):
            raise TypeError(f"guard must be a str, not {type(guard).__name__}.")
        self._set_up(
            "lock", name, timeout=timeout, wait=wait, auto_renew=auto_renew, label=label,
            using=using, group=group, layout=_lock_layout, reentrant=reentrant,
            fencing=fencing, job_id=None if job_id is None else job_id_checked(job_id),
            guard=guard or None, fair=fair,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"<Lock {self._book.name!r}{' held' if self._book.hold() else ''}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle, copy.copy and copy.deepcopy give a new, unheld Lock with the same name and
        # options: a hold belongs to the thread or task (and process) that took it, and a
        # copy that shared it could release it from under its owner.
        book = self._book
        options: dict[str, Any] = {
            "timeout": book.timeout, "wait": book.wait, "auto_renew": book.auto_renew,
            "reentrant": book.reentrant, "fencing": book.fencing, "label": book.label,
            "using": book.using, "job_id": book.job_id, "guard": book.guard,
            "group": book.given_group, "fair": book.fair,
        }  # fmt: skip
        return (functools.partial(Lock, book.name, **options), ())

    # -- the lock's own -------------------------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current holder's acquisition (``fencing=True`` only)."""
        hold = self._book.hold()
        return hold.fence if hold else None

    def detach(self) -> str:
        """Stop holding the lock in this thread/task without releasing it, and return the lease's
        token: the lease runs on, no longer renewed, until it ends or another process takes it over
        (a job's next run, after ``reservations.reserve`` made it the job's reservation again;
        ``registry.force_release``). All levels of a re-entrant hold are given up. No round trip.
        Raises ``LockNotOwned`` when this thread/task does not hold it."""
        owner = current_owner()
        hold = self._book.held_or_raise(owner)
        self._book.let_go(owner, hold)
        return hold.token

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        return bool(self._read("EXISTS"))

    def owned(self) -> bool:
        """Whether this thread/task holds the lock right now (asks Redis)."""
        hold = self._book.hold()
        return hold is not None and held_by(self._read("GET"), hold.token)

    def ttl(self) -> float | None:
        """Seconds left on the current lease, whoever holds it; None when nobody does, and
        ``math.inf`` for a key without an expiry (never ours: someone wrote it by hand)."""
        milliseconds = int(self._read("PTTL"))
        if milliseconds == -1:
            logger.warning("Lock %r: its key %s never expires", self.name, self._lease_key())
            return math.inf
        return milliseconds / 1000 if milliseconds >= 0 else None

    def _lease_key(self) -> str:
        return str(self._book.alias_and_keys()[1].lease)

    def _read(self, command: str) -> Any:
        alias, keys = self._book.alias_and_keys()
        try:
            return backend_of(alias).perform(Command((command, keys.lease)))
        except RedisError as exc:
            raise self._book.backend_error("read", exc) from exc


def _lock_layout(name: str, alias: LockAlias, quorum: bool) -> LockKeys:
    """A lock's keys: the same on one server, a Cluster or each server of a quorum."""
    return lock_keys(name, alias)


# What Lock() takes by name (name too: Lock(name="x"), as redis-py's and python-redis-lock's
# callers write), and the options of them that @lock(name, **options) and the others pass on.
_KEYWORDS = keyword_names(Lock.__init__)
LOCK_OPTIONS = _KEYWORDS - {"name"}
