"""A primitive's options, resolved against the settings on first use (``Options``, made by
``resolve_options``): its own where given, else the settings' defaults; and the plan of one
acquisition under them (``Options.acquisition``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..backends import Backend
from ..backends.clients import LockAlias, quorum_members
from ..conf import lock_settings
from ..core import durations, flows
from ..core.layout import KeyLayout
from ..core.lease import takeover_prefixes
from . import owners, reports
from .background.dead_holders import dead_holder_watch
from .background.process_records import here
from .claims import Pending
from .keys import readable_tag
from .owners import OwnerRecords
from .strays import strays

__all__ = ["Options", "resolve_options"]


@dataclass(frozen=True)
class Options:
    """What a Lock takes from the settings, on first use."""

    alias: LockAlias
    keys: KeyLayout
    lease: float
    renew: bool
    wait: float
    quorum: bool
    replicas: int  # that must confirm an acquisition (MIN_REPLICAS)
    replica_timeout_ms: int
    records: OwnerRecords  # its acquisitions' owner records
    # A plain lock (not fenced, re-entrant, held for a job; not a semaphore), neither on a
    # quorum nor confirmed by replicas: a free one is taken by the flat path (uncontended.py).
    flat: bool
    lease_ms: int
    # Told each holder a join finds (the watch for dead holders), or None.
    on_holder: Callable[[flows.AcquirePlan, Any], None] | None = None

    def acquisition(
        self, owner: object, *, wait: float | None, want_result: bool, fencing: bool,
        limit: int, job_id: str | None, started: float, first: str,
        on_contended: Callable[[flows.AcquirePlan, Any], None], token: str | None = None,
        fair: bool = True,
    ) -> Pending:  # fmt: skip
        """One acquisition by ``owner`` under these settings, planned for the flows
        (``wait``: this call's, None: the settings'; ``first``: how it starts; ``token``:
        the one a flat try sent already, else a new one)."""
        if token is None:
            token = owners.new_token() if job_id is None else owners.job_token(job_id)
        plan = flows.AcquirePlan(
            keys=self.keys,
            token=token,
            lease_ms=self.lease_ms,
            record=self.records.encoded(owner, self.lease),
            max_wait=self.wait if wait is None else wait,
            clock=time.monotonic,
            first=first,
            queues=not self.quorum,
            fencing=fencing,
            limit=limit,
            want_result=want_result,
            unfair=not fair,
            job=job_id is not None,
            takeover=() if job_id is None else takeover_prefixes(job_id),
            report_holder=reports.contention_observed,
            on_contended=on_contended,
            on_holder=self.on_holder if not limit else None,  # (a lock's holder)
            retry_soon=Backend.retry_soon,
            unreachable=Backend.unreachable,
            replicas=self.replicas,
            replica_timeout_ms=self.replica_timeout_ms,
            started=started,
            strays=strays.take(self.keys.lease, started),
            strayed=strays.left,
        )
        return Pending(owner, self.alias, plan, self.lease, self.renew)


def resolve_options(
    name: str, *, using: Any, timeout: float | None, auto_renew: bool | None,
    wait: float | None, label: str | None, guard: str | None,
    layout: Callable[[LockAlias, bool], Any], group: str | None = None, plain: bool = False,
) -> Options:  # fmt: skip
    """What a primitive named ``name`` takes from the settings: its own options where given,
    else the settings' defaults (read now; the primitive keeps the result). ``layout(alias,
    quorum)``: its keys; ``plain``: a lock with none of the options the flat path leaves to
    the flows."""
    alias = using or lock_settings.CACHE_ALIAS
    if timeout is None:
        lease = lock_settings.TIMEOUT
        renew = lock_settings.AUTO_RENEW if auto_renew is None else auto_renew
    else:
        lease, renew = timeout, bool(auto_renew)
    quorum = quorum_members(alias) is not None
    records = OwnerRecords(
        label=label, guard=guard, group=group,
        name=None if readable_tag(name) else name,  # else the key says it
    )  # fmt: skip
    watch = lock_settings.DEAD_HOLDERS and not quorum and here() is not None
    replicas = _replicas(quorum)
    return Options(
        alias, layout(alias, quorum), lease, renew,
        wait if wait is not None else lock_settings.WAIT, quorum, replicas,
        max(1, int(lock_settings.REPLICA_TIMEOUT * 1000)), records,
        plain and not quorum and not replicas, durations.milliseconds(lease),
        functools.partial(_seen, alias) if watch else None,
    )  # fmt: skip


def _seen(alias: LockAlias, plan: flows.AcquirePlan, holder: Any) -> None:
    dead_holder_watch.seen(alias, plan.keys, holder)


def _replicas(quorum: bool) -> int:
    """Replicas that must confirm an acquisition."""
    replicas = lock_settings.MIN_REPLICAS
    if replicas and quorum:
        raise ImproperlyConfigured(
            "DJANGO_REDIS_LOCK_MIN_REPLICAS does not apply in quorum mode: its servers are "
            "independent, with no replicas to wait for. Set it to 0 for quorum locks."
        )
    return int(replicas)
