"""The key-layout contract: what the flows need to know of a primitive's keys. A lock's
(``lease.LockKeys``) and a semaphore's (``permits.PermitKeys``) keep it; a new primitive gives
one more (its keys, and which of its scripts play take, join, release and extend, with replies
of the lock's shape) and shares every flow."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

__all__ = ["KeyLayout"]


class KeyLayout(Protocol):
    """A primitive's keys, all sharing one hash tag (one Redis Cluster slot). ``lease`` is the
    key the primitive lives in; ``queue``, ``waiters`` and each waiter's wake-up list
    (``wake(token)``) exist while someone waits."""

    TAKE: ClassVar[str]  # the scripts' names (``backends/lua/<name>.lua``)
    JOIN: ClassVar[str]
    RELEASE: ClassVar[str]
    EXTEND: ClassVar[str]

    @property
    def lease(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def waiters(self) -> str: ...

    @property
    def wake_prefix(self) -> str: ...

    def wake(self, token: str) -> str:
        """A waiter's wake-up list."""
        ...

    def release_keys(self, expected: str, token: str = "") -> tuple[str, ...]:
        """The release script's keys for the holder ``token``, expecting ``expected`` first in
        line."""
        ...

    def extend_keys(self) -> tuple[str, ...]:
        """The extend script's keys."""
        ...

    def take_call(self, plan: Any, flags: str) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """The take script's keys and arguments for ``plan`` (an ``AcquirePlan``)."""
        ...

    def join_call(
        self, plan: Any, mode: int, flags: str, liveness_ms: int
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """The join script's keys and arguments."""
        ...
