"""The watch for dead holders in the simulation: after a client crashes, a process of its
machine that saw it hold a lock may end that lease, with the dead client's token
(``flows.release``: the lease goes to the first live waiter, or is deleted; only if it is still
that token's). It comes at any later moment the schedule picks: after the lease ran out and
another took the lock, too, when the release must change nothing."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from django_redis_lock.core import flows
from django_redis_lock.core.lease import JOB_SEPARATOR, LockKeys, holder_token, is_reservation
from django_redis_lock.core.requests import Command, Request

from .clients import Client
from .ledger import Ledger

__all__ = ["watch"]


def keys_of(facts: Any) -> LockKeys:
    return LockKeys.of(facts.lease_key)


def watch(ledger: Ledger, dead: Client) -> Any:
    """The watch's program: each lock's holder read, and its lease ended if it is ``dead``'s
    (a simulated client's tokens are ``<name>.<round>...``, a job's run's ``<job>~<name>``)."""

    def program(client: Client) -> Generator[Request, Any, None]:
        for name, facts in list(ledger.locks.items()):
            if facts.limit != 1:
                continue  # (a semaphore's permits: the lease bounds them)
            try:
                value = yield Command(("GET", facts.lease_key))
            except Exception as error:  # (a lost request or reply: it looks at the next)
                client.notes.append(f"reading the holder failed: {error!r}")
                continue
            token = holder_token(value)
            if token is None or is_reservation(token):
                continue
            own = token.rpartition(JOB_SEPARATOR)[2]
            if own != dead.name and not own.startswith(dead.name + "."):
                continue
            # From here the dead client's hold counts for nothing (it is dead, and its lease
            # may end at any moment now, even should this watch die halfway); a live one's
            # still does, and a release that ended one would fail the check.
            ledger.taken_over(name, token)
            try:
                code = yield from flows.release(keys_of(facts), token, "", cleanup=True)
            except (
                Exception
            ) as error:  # (background/dead_holders.py logs it; it may have run all the same)
                client.notes.append(f"takeover failed: {error!r}")
                continue
            if code == -2:
                ledger.fail(f"the takeover of {name!r} found no lock there")

    return program
