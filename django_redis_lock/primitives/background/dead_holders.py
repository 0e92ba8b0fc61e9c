"""The watch for dead holders: one daemon thread per process that ends the lease of a holder
known to be dead (``core/dead_holders.py``), so that the waiters behind it take their turns in
milliseconds instead of when its lease runs out.

Each time a waiter of this process finds its lock held (each join), it tells
:data:`dead_holder_watch` the holder's lease value (``seen``: a dict lookup when that holder is
known already). The thread reads the holder's process record once, and when the holder runs in
the same place as this process (same boot, same PID namespace) it looks the pid up: dead
already, its lease is ended at once; alive, it keeps a pidfd of it (Linux 5.3+), which the
kernel makes readable the moment the process exits, and ends its leases then. Without pidfds,
each later sighting looks again.

Ending a lease: each lock the dead process was seen holding is read, and if a token of that
process holds it (the one seen, or a later one), ``release.lua`` with that token
(``flows.release``) hands it to the first live waiter in line (who is woken), or deletes it;
only if it is still that token's. A Gunicorn or Celery worker killed by the OOM killer, a
SIGKILL, a segfault: its locks pass on within two round trips. Nothing here ever ends a lease
of a live process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from ...backends import backend_of
from ...backends.clients import LockAlias
from ...backends.drivers import run
from ...core import flows
from ...core.dead_holders import ProcessRecord, dead, process_of
from ...core.layout import KeyLayout
from ...core.lease import holder_token
from ..keys import process_key
from . import process_records

__all__ = ["dead_holder_watch"]

logger = logging.getLogger("django_redis_lock")

# A holder not seen by any waiter for this long is no longer watched.
FORGET_AFTER = 60.0
# How often the thread looks at its watches when nothing happens (to forget the old ones).
IDLE = 5.0
# A holder whose record was not there (not written yet) is looked up again after this long.
RECORD_AGAIN = 5.0
# How long the watch waits for any one reply. It is one thread for every server of the
# process: a server that stops answering (paused, partitioned) without a SOCKET_TIMEOUT
# would otherwise hold it up for good, and with it the deaths seen on every other server.
REPLY_TIMEOUT = 2.0


@dataclass(eq=False)
class _Process:
    """A holder's process, as far as this one knows it: its record (None: none to be had),
    whether it is dead, and a pidfd while it is alive."""

    owner: str  # its process id, which its tokens start with
    record: ProcessRecord | None
    dead: bool = False
    pidfd: int | None = None
    # The locks it was seen holding: lease key -> (alias, keys), each read when it dies.
    leases: dict[str, tuple[LockAlias, KeyLayout]] = field(default_factory=dict)
    seen_at: float = 0.0
    looked_at: float = 0.0  # when its record was last read (monotonic)


class _Deaths:
    def __init__(self) -> None:
        self.clear()
        os.register_at_fork(after_in_child=self.clear)

    def clear(self) -> None:
        """Forget every sighting and watch, with no thread yet (a forked child's start)."""
        self._lock = threading.Lock()
        # Sightings the thread has not taken yet: (owner, lease key) -> (alias, keys).
        self._new: dict[tuple[str, str], tuple[LockAlias, KeyLayout]] = {}
        # The owners whose next sightings need not wake the thread: watched by a pidfd (whose
        # exit wakes it), elsewhere, this very process, or without a record for now. It takes
        # their sightings at its next look.
        self._settled: set[str] = set()
        self._woken = False  # told of sightings it has not taken yet
        self._thread: threading.Thread | None = None
        self._wake_read, self._wake_write = -1, -1

    def seen(self, alias: LockAlias, keys: KeyLayout, holder: Any) -> None:
        """A waiter of this process found ``holder`` (a lease value) holding the lock of
        ``keys`` on ``alias``. Cheap, and never blocks: the thread does the looking, and is
        woken only for a holder it has not settled yet (a lock passed between live processes
        costs a dict entry per join)."""
        if process_records.here() is None:
            return
        token = holder_token(holder)
        owner = process_of(token) if token is not None else None
        if token is None or owner is None:
            return
        with self._lock:
            self._new[owner, keys.lease] = (alias, keys)
            waking = owner not in self._settled and not self._woken
            self._woken = self._woken or waking
            if self._thread is None or not self._thread.is_alive():
                self._wake_read, self._wake_write = os.pipe()
                os.set_blocking(self._wake_write, False)
                self._thread = threading.Thread(
                    target=self._run, name="django-redis-lock-dead-holders", daemon=True
                )
                self._thread.start()
                return
        if waking:
            with contextlib.suppress(OSError):  # (full: the thread has been told already)
                os.write(self._wake_write, b"!")

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_read, selectors.EVENT_READ, None)
        watched: dict[str, _Process] = {}
        events: list[Any] = []
        while True:
            try:
                # The sightings first: a holder that died then has every lock it was seen
                # holding read.
                with self._lock:
                    new, self._new, self._woken = self._new, {}, False
                for (owner, _), (alias, keys) in new.items():
                    self._sighted(selector, watched, alias, keys, owner)
                for key, _ in events:
                    if key.data is None:
                        os.read(self._wake_read, 4096)
                    else:
                        self._died(selector, key.data)
                self._forget_old(selector, watched)
                with self._lock:
                    pending = bool(self._new)  # (seen meanwhile, perhaps without waking us)
                events = [] if pending else selector.select(IDLE)
            except Exception:  # the watch must never die
                logger.exception("django-redis-lock: the watch for dead holders failed")
                events = []
                time.sleep(1.0)

    def _sighted(
        self, selector: selectors.BaseSelector, watched: dict[str, _Process], alias: LockAlias,
        keys: KeyLayout, owner: str,
    ) -> None:  # fmt: skip
        now = time.monotonic()
        process = watched.get(owner)
        if process is None:
            process = watched[owner] = _Process(owner, self._record(alias, owner), looked_at=now)
        elif process.record is None and now - process.looked_at > RECORD_AGAIN:
            process.record, process.looked_at = self._record(alias, owner), now
        process.seen_at = now
        record = process.record
        if record is None or record.place != process_records.here() or record.pid == os.getpid():
            self._settle(owner)  # (nothing to know of it from here, or it is this very process)
            return
        process.leases[keys.lease] = (alias, keys)
        if process.dead:
            self._died(selector, process)
        elif process.pidfd is None:  # (watched by its pidfd: its exit tells)
            if dead(record, process_records.here(), process_records.started(record.pid)):
                self._died(selector, process)
            else:
                self._watch(selector, process, record)
                if process.pidfd is not None:
                    self._settle(owner)

    def _settle(self, owner: str) -> None:
        with self._lock:
            self._settled.add(owner)

    def _unsettle(self, owner: str) -> None:
        with self._lock:
            self._settled.discard(owner)

    def _record(self, alias: LockAlias, owner: str) -> ProcessRecord | None:
        try:
            reply = backend_of(alias).send_request(
                "GET", process_key(alias, owner), reply_timeout=REPLY_TIMEOUT
            )
        except RedisError:
            return None
        return ProcessRecord.decode(reply)

    def _watch(
        self, selector: selectors.BaseSelector, process: _Process, record: ProcessRecord
    ) -> None:
        """A pidfd of the live holder, made readable by its exit: opened first, then the pid
        checked to be the recorded process still (a pidfd names one process for good)."""
        try:
            pidfd = os.pidfd_open(record.pid)
        except (AttributeError, OSError):  # no pidfds here (then each sighting looks again)
            return
        if process_records.started(record.pid) != record.started:  # gone between the two
            os.close(pidfd)
            process.dead = True
            self._died(selector, process)
            return
        process.pidfd = pidfd
        selector.register(pidfd, selectors.EVENT_READ, process)

    def _died(self, selector: selectors.BaseSelector, process: _Process) -> None:
        """``process`` is dead: end its lease of each lock it was seen holding, if it holds
        one still. The lease is read first: the process may have taken the lock again since it
        was last seen (a new token, an unfair lock's releaser coming back), or let it go."""
        process.dead = True
        self._unsettle(process.owner)  # (its later sightings wake us: each lease is ended)
        if process.pidfd is not None:
            selector.unregister(process.pidfd)
            os.close(process.pidfd)
            process.pidfd = None
        leases, process.leases = process.leases, {}
        for alias, keys in leases.values():
            backend = backend_of(alias)
            try:
                token = holder_token(
                    backend.send_request("GET", keys.lease, reply_timeout=REPLY_TIMEOUT)
                )
                if token is None or process_of(token) != process.owner:
                    continue  # (let go, or another's now)
                # (Only if the lease is that token's still, in the script: atomically.)
                code = run(
                    flows.release(keys, token, "", reply_timeout=REPLY_TIMEOUT, cleanup=True),
                    backend,
                )
            except RedisError as exc:
                logger.warning("Could not end a dead holder's lease on %s: %s", keys.lease, exc)
                continue
            if code == 0:
                assert process.record is not None
                logger.info(
                    "Ended the lease of %s: its holder, pid %d on this machine, has died.",
                    keys.lease, process.record.pid,
                )  # fmt: skip

    def _forget_old(self, selector: selectors.BaseSelector, watched: dict[str, _Process]) -> None:
        now = time.monotonic()
        for owner, process in list(watched.items()):
            if now - process.seen_at > FORGET_AFTER:
                if process.pidfd is not None:
                    selector.unregister(process.pidfd)
                    os.close(process.pidfd)
                del watched[owner]
                self._unsettle(owner)
            elif process.record is None and now - process.looked_at > RECORD_AGAIN:
                self._unsettle(owner)  # its next sighting wakes us to read its record again


dead_holder_watch = _Deaths()
