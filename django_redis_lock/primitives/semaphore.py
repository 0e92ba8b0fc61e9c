"""``Semaphore``: at most ``limit`` holders at once, each with a leased, owner-checked permit.

    with Semaphore("pdf-renders", limit=4, label="PDF render"):
        render()                              # renewed in the background while inside

    partner = Semaphore(f"partner-api:{partner_id}", limit=2, wait=10)
    if partner.acquire():                     # -> bool
        try: ...
        finally: partner.release()            # only ever gives back our own permit

A permit is what a lock's lease is: it ends by itself when its holder dies (judged by the Redis
server's clock, never a client's), it is renewed while held, only its holder can give it back,
and losing it is reported (``lock_lost``, ``LockLost``). Waiters queue, first come first served,
and a release hands its permit straight to the first live one, which it wakes (no polling);
several at once when several permits are free. The scripts are ``lua/permit_*.lua``; the
acquisition runs the lock's own flow (``core/flows.py``) on a semaphore's keys
(``core/permits.py``).

Each caller is held to its own ``limit``: if processes disagree (a rolling deploy that changes
it), up to the largest number may hold a permit meanwhile, and a WARNING says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import RedisError

from ..backends import backend_of
from ..backends.clients import LockAlias
from ..core.permits import Permit, PermitKeys, decode_permit
from ..core.requests import Pipeline
from ..hints import check_names, keyword_names
from .keys import permit_keys
from .leased import Leased

__all__ = [
    "MAX_LIMIT",
    "SEMAPHORE_OPTIONS",
    "Semaphore",
    "SemaphoreState",
    "read_state",
    "state_commands",
    "state_from",
]

F = TypeVar("F", bound=Callable[..., Any])

# Permits are counted in one sorted set, and each release walks the queue for as many waiters
# as it frees: a bound keeps every script call short.
MAX_LIMIT = 10_000


class Semaphore(Leased):
    """At most ``limit`` holders of ``name`` at once.

    ``limit``: how many permits (1 to 10,000), by name or second (``Semaphore("pdf", 4)``, as
    ``threading.Semaphore(4)``). The other options are a ``Lock``'s:
    ``timeout`` (the lease of each permit, in seconds; not given: ``DJANGO_REDIS_LOCK_TIMEOUT``,
    renewed in the background while held), ``wait`` (the longest wait for a permit; default
    ``DJANGO_REDIS_LOCK_WAIT``, ``0`` never blocks), ``auto_renew``, ``label`` and ``using`` (a
    cache alias; quorum mode is not supported yet). A thread or task holds at most one permit
    of a ``Semaphore`` object at a time (acquiring again raises ``LockError``); take two
    through two objects. A semaphore and a lock of the same name are independent.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Semaphore:
        check_names(kwargs, "Semaphore()", takes=_KEYWORDS)
        return super().__new__(cls)

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        timeout: float | None = None,
        wait: float | None = None,
        auto_renew: bool | None = None,
        label: str | None = None,
        using: str | None = None,
        group: str | None = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int (how many holders), not {limit!r}.")
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}.")
        if isinstance(using, list | tuple):
            raise NotImplementedError(
                "Semaphores do not support quorum mode yet: pass one cache alias as using."
            )
        self._set_up(
            "semaphore", name, timeout=timeout, wait=wait, auto_renew=auto_renew, label=label,
            using=using, group=group, layout=_permit_layout, limit=limit,
        )  # fmt: skip

    def __repr__(self) -> str:
        held = " held" if self._book.hold() else ""
        return f"<Semaphore {self._book.name!r} limit={self._book.limit}{held}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # As a Lock's: a copy is a new, unheld Semaphore with the same name and options.
        book = self._book
        options: dict[str, Any] = {
            "limit": book.limit, "timeout": book.timeout, "wait": book.wait,
            "auto_renew": book.auto_renew, "label": book.label, "using": book.using,
            "group": book.given_group,
        }  # fmt: skip
        return (functools.partial(Semaphore, book.name, **options), ())

    @property
    def limit(self) -> int:
        return self._book.limit

    # -- inspection ----------------------------------------------------------------------------

    def holders(self) -> list[Permit]:
        """The permits held now, oldest first: who holds each (``Permit.record``, an owner
        record as a lock's; ``decode_lease(permit.as_lease())`` reads it). One round trip."""
        return self._snapshot().permits()

    def available(self) -> int:
        """How many permits are free now by this object's ``limit`` (none while waiters are
        queued: they are about to take them). One round trip."""
        snapshot = self._snapshot()
        return max(0, self._book.limit - len(snapshot.held) - snapshot.queued)

    def owned(self) -> bool:
        """Whether this thread/task holds a permit right now (asks Redis)."""
        hold = self._book.hold()
        return hold is not None and hold.token in self._snapshot().held

    def _snapshot(self) -> SemaphoreState:
        alias, keys = self._book.alias_and_keys()
        assert isinstance(keys, PermitKeys)
        try:
            return read_state(backend_of(alias), keys)
        except RedisError as exc:
            raise self._book.backend_error("read", exc) from exc


def _permit_layout(name: str, alias: LockAlias, quorum: bool) -> PermitKeys:
    if quorum:
        raise NotImplementedError(
            f"Semaphore {name!r}: semaphores do not support quorum mode yet "
            f"({alias!r} is a quorum); use one cache alias."
        )
    return permit_keys(name, alias)


@dataclass(frozen=True)
class SemaphoreState:
    """A semaphore as read at one moment (:func:`read_state`): its owner entries, when each
    permit's lease ends (server ms), how many wait, and the server's time then."""

    owners: dict[str, Any]
    ends: dict[str, float]
    queued: int
    now: int

    @property
    def held(self) -> set[str]:
        """The tokens of the permits whose lease has not ended."""
        return {token for token, end in self.ends.items() if end > self.now}

    def permits(self) -> list[Permit]:
        """The live permits, oldest first (an entry we did not write is passed over)."""
        permits = []
        for token in self.held:
            entry = self.owners.get(token)
            if entry is None:
                continue
            try:
                permits.append(decode_permit(token, entry))
            except ValueError:
                continue  # not written by us: nothing to show
        return sorted(permits, key=lambda permit: (permit.since_ms, permit.token))


def state_commands(keys: PermitKeys) -> tuple[tuple[Any, ...], ...]:
    """The commands that read the semaphore whose keys are ``keys`` (sent in one pipeline;
    :func:`state_from` reads their replies)."""
    return (
        ("HGETALL", keys.owners),
        ("ZRANGE", keys.holders, 0, -1, "WITHSCORES"),
        ("LLEN", keys.queue),
        ("TIME",),
    )


def state_from(replies: Sequence[Any]) -> SemaphoreState:
    """The state the replies to :func:`state_commands` tell (raises the first that is an
    error: ``ResponseError`` for a key of ours of another type)."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    owners, scored, queued, (seconds, micros) = replies
    return SemaphoreState(
        owners={_text(token): entry for token, entry in _pairs(owners)},
        ends={_text(token): float(score) for token, score in _pairs(scored)},
        queued=int(queued),
        now=int(seconds) * 1000 + int(micros) // 1000,  # the server's clock judges leases
    )


def read_state(backend: Any, keys: PermitKeys) -> SemaphoreState:
    """The semaphore whose keys are ``keys``, in one round trip on ``backend`` (of its alias).
    Raises ``RedisError`` when Redis cannot be read."""
    return state_from(backend.perform(Pipeline(state_commands(keys))))


def _pairs(reply: Any) -> list[tuple[Any, Any]]:
    """A reply of pairs, parsed (a dict, or a list of pairs) or raw (one flat list), as
    redis-py versions and protocols give it."""
    if isinstance(reply, dict):
        return list(reply.items())
    if reply and not isinstance(reply[0], list | tuple):
        return list(zip(reply[::2], reply[1::2], strict=True))
    return [tuple(pair) for pair in reply]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# What Semaphore() takes by name (name and limit too: Semaphore(name="x", limit=2), as
# threading.Semaphore and the other libraries' callers write), and the options of them that
# @semaphore(name, limit=..., **options) passes on to it.
_KEYWORDS = keyword_names(Semaphore.__init__)
SEMAPHORE_OPTIONS = _KEYWORDS - {"name"}
