"""``LocksPanel``: the locks a request took, in django-debug-toolbar (the ``debug-toolbar`` extra).

    # settings.py (with the toolbar installed as its documentation says)
    DEBUG_TOOLBAR_PANELS = [
        *debug_toolbar.settings.PANELS_DEFAULTS,
        "django_redis_lock.debug_toolbar.LocksPanel",
    ]

For each lock, semaphore permit, ``lock_many`` member and guard's lock the request asked for:
its name, group and label, how long it waited and for whom (the holder's host, pid and
thread), how long it was held, and how it ended: acquired (and released), timed out, the
holder's result given instead (a duplicate submission replayed), an error, or lost. The
panel's title gives the request's total wait, and a ``Server-Timing`` entry carries it to the
browser's network tab.

Built on the lock's signals (``signals.py``, ``lock_not_acquired`` included): receivers are
connected only while a request is being recorded, and each event goes to the recording of the
request it happened in (a context variable: threads and asyncio tasks of other requests are
not mixed in). A loss reported by the renewal thread is matched to the recording that holds
that lock. Without the toolbar nothing here is imported, so it costs nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import signals

try:
    from debug_toolbar.panels import Panel
except ImportError:  # the extra is not installed: say so when the panel is used, not on import

    class Panel:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError(
                "LocksPanel needs django-debug-toolbar: "
                'pip install "django-redis-lock[debug-toolbar]"'
            )


__all__ = ["LocksPanel", "Taken"]

# What a taking ended as, in the panel's words.
WAITING, ACQUIRED, RELEASED, LOST = "waiting", "acquired", "released", "lost"
NOT_ACQUIRED = {"timed_out": "timed out", "error": "error", "done": "replayed"}


@dataclass
class Taken:
    """One acquisition a request asked for, as the panel shows it (plain values only: the
    toolbar keeps its panels' stats between requests)."""

    name: str
    kind: str  # "lock", "semaphore"
    group: str
    label: str | None
    at_ms: float  # when it started, from the start of the recording
    outcome: str = WAITING
    waited_ms: float | None = None
    held_ms: float | None = None
    holder: str | None = None  # who held it when it had to wait
    fencing_token: int | None = None
    reason: str | None = None  # why it was lost
    lock_id: int = field(default=0, repr=False)  # the Lock object's id(), while recording


class _Recording:
    """The takings of one request, in the order they began."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.taken: list[Taken] = []
        self.guard = threading.Lock()

    def begin(self, lock: Any, outcome: str = WAITING) -> Taken:
        taken = Taken(
            name=lock.name, kind=type(lock).__name__.lower(), group=lock.group, label=lock.label,
            at_ms=(time.monotonic() - self.started) * 1000, outcome=outcome, lock_id=id(lock),
        )  # fmt: skip
        with self.guard:
            self.taken.append(taken)
        return taken

    def latest(self, lock: Any, *outcomes: str) -> Taken | None:
        """The latest taking of ``lock`` that is still ``outcomes`` (a re-entry's release
        ends the latest acquisition first). By its object and its name: a Lock dropped while
        held may leave its id() to a later one."""
        with self.guard:
            for taken in reversed(self.taken):
                if (taken.lock_id, taken.name) == (
                    id(lock),
                    lock.name,
                ) and taken.outcome in outcomes:
                    return taken
        return None


_recording: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar(
    "django_redis_lock_debug_toolbar", default=None
)
_active: set[_Recording] = set()  # every request being recorded now (for losses: see below)
_active_guard = threading.Lock()


def _holder(owner: dict[str, Any] | None) -> str | None:
    if not owner:
        return None
    return f"{owner.get('host', '?')}/{owner.get('pid', '?')} {owner.get('thread', '')}".strip()


def _on_contended(sender: Any, *, lock: Any, owner: Any = None, **kwargs: Any) -> None:
    recording = _recording.get()
    if recording is not None:
        recording.begin(lock).holder = _holder(owner)


def _on_acquired(
    sender: Any, *, lock: Any, waited: float, fencing_token: Any = None, **kwargs: Any
) -> None:
    recording = _recording.get()
    if recording is None:
        return
    taken = recording.latest(lock, WAITING) or recording.begin(lock)
    taken.outcome, taken.waited_ms = ACQUIRED, waited * 1000
    taken.fencing_token = fencing_token


def _on_not_acquired(
    sender: Any, *, lock: Any, waited: float, outcome: str, **kwargs: Any
) -> None:
    recording = _recording.get()
    if recording is None:
        return
    taken = recording.latest(lock, WAITING) or recording.begin(lock)
    taken.outcome, taken.waited_ms = NOT_ACQUIRED.get(outcome, outcome), waited * 1000


def _on_released(sender: Any, *, lock: Any, held: float, **kwargs: Any) -> None:
    recording = _recording.get()
    taken = recording.latest(lock, ACQUIRED) if recording is not None else None
    if taken is not None:
        taken.outcome, taken.held_ms = RELEASED, held * 1000


def _on_lost(sender: Any, *, lock: Any, held: float, reason: str, **kwargs: Any) -> None:
    # Usually sent from the renewal thread, outside the request's context: the recording that
    # holds this lock is looked for among those under way.
    with _active_guard:
        recordings = list(_active)
    for recording in recordings:
        taken = recording.latest(lock, ACQUIRED)
        if taken is not None:
            taken.outcome, taken.held_ms, taken.reason = LOST, held * 1000, reason
            return


_RECEIVERS = (
    (signals.lock_contended, _on_contended),
    (signals.lock_acquired, _on_acquired),
    (signals.lock_not_acquired, _on_not_acquired),
    (signals.lock_released, _on_released),
    (signals.lock_lost, _on_lost),
)


def _start() -> _Recording:
    recording = _Recording()
    with _active_guard:
        if not _active:  # the first request recorded: listen (and only while one is)
            for signal, receiver in _RECEIVERS:
                signal.connect(receiver, dispatch_uid=f"drl-toolbar-{receiver.__name__}")
        _active.add(recording)
    return recording


def _stop(recording: _Recording) -> None:
    with _active_guard:
        _active.discard(recording)
        if not _active:
            for signal, receiver in _RECEIVERS:
                signal.disconnect(dispatch_uid=f"drl-toolbar-{receiver.__name__}")


class LocksPanel(Panel):
    """The locks the request took: what each waited, for whom, how long it was held, and how
    it ended; the total wait in the title."""

    template = "django_redis_lock/debug_toolbar/locks.html"
    is_async = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recording: _Recording | None = None
        self._token: contextvars.Token[_Recording | None] | None = None

    def enable_instrumentation(self) -> None:
        if self._recording is None:
            self._recording = _start()
            self._token = _recording.set(self._recording)

    def disable_instrumentation(self) -> None:
        if self._recording is not None:
            _stop(self._recording)
        if self._token is not None:
            # (The toolbar may end a request in another context than it began: then the
            # variable is that context's, and ends with it.)
            with contextlib.suppress(ValueError):
                _recording.reset(self._token)
            self._token = None

    def generate_stats(self, request: Any, response: Any) -> None:
        recording = self._recording
        taken = [] if recording is None else list(recording.taken)
        waited_ms = sum(item.waited_ms or 0.0 for item in taken)
        rows = []
        for item in taken:
            row = asdict(item)
            del row["lock_id"]
            rows.append(row)
        self.record_stats({"taken": rows, "waited_ms": waited_ms, "count": len(rows)})

    def generate_server_timing(self, request: Any, response: Any) -> None:
        stats = self.get_stats()
        if stats.get("count"):
            self.record_server_timing("locks", "Waiting for locks", stats["waited_ms"])

    @property
    def nav_title(self) -> str:
        return str(_("Locks"))

    @property
    def nav_subtitle(self) -> str:
        stats = self.get_stats()
        count = stats.get("count", 0)
        return ngettext(
            "%(count)d lock, %(waited).1f ms waiting",
            "%(count)d locks, %(waited).1f ms waiting",
            count,
        ) % {"count": count, "waited": stats.get("waited_ms", 0.0)}

    @property
    def title(self) -> str:
        waited = self.get_stats().get("waited_ms", 0.0)
        return str(_("Locks: %(waited).1f ms waiting in all") % {"waited": waited})
