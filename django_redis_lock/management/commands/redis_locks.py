"""``manage.py redis_locks``: see and free the locks held right now.

    redis_locks list [--match TEXT] [--limit N] [--json]
    redis_locks show NAME [--json]
    redis_locks release NAME [--token TOKEN] [--yes]
    redis_locks semaphores [NAME] [--match TEXT] [--json]
    redis_locks release-permit NAME TOKEN
    redis_locks stats [--top N] [--json] [--watch [SECONDS] [--rounds N]]
    redis_locks acl [--user NAME]

Exit status: 0 done; 1 the lock is not held, changed hands before the release (nothing was
deleted), or the release was not confirmed; 2 bad usage; 3 Redis could not be reached (for a
quorum: fewer than a majority of its servers could be read), said in one line on stderr.
``--json`` prints the fields of ``LockInfo.as_dict()``, with stable keys, for scripts.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from django_redis_lock.core.durations import readable, readable_elapsed
from django_redis_lock.exceptions import LockBackendError
from django_redis_lock.links import docs_page
from django_redis_lock.management import lines
from django_redis_lock.primitives.acl import acl_rule
from django_redis_lock.registry import census
from django_redis_lock.registry import locks as lock_registry

# The exit status when Redis (or a quorum's majority) could not be read.
UNREACHABLE = 3


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _job(info: lock_registry.LockInfo) -> str:
    """The task a lock is held for: its id, queued or running, and its guard's mode."""
    if info.job_id is None:
        return ""
    state = "queued" if info.queued else "running"
    return f"{info.job_id} {state}" + (f" ({info.guard})" if info.guard else "")


class Command(BaseCommand):
    help = "List, show and force-release the Redis locks held right now."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        listing = actions.add_parser("list", help="the locks held now (SCAN, never KEYS)")
        listing.add_argument("--match", help="only names containing this text")
        listing.add_argument("--limit", type=_positive, help="at most this many")
        listing.add_argument("--json", action="store_true", dest="as_json", help="a JSON array")
        show = actions.add_parser("show", help="one lock's whole owner record")
        show.add_argument("name")
        show.add_argument("--json", action="store_true", dest="as_json", help="a JSON object")
        release = actions.add_parser("release", help="force-release a lock")
        release.add_argument("name")
        release.add_argument(
            "--token", help="release only if the lock still has this token (from list or show)"
        )
        release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        semaphores = actions.add_parser(
            "semaphores", help="the semaphores with a permit held now, or one's holders"
        )
        semaphores.add_argument("name", nargs="?", help="show this semaphore's holders")
        semaphores.add_argument("--match", help="only names containing this text")
        semaphores.add_argument("--json", action="store_true", dest="as_json", help="JSON")
        permit = actions.add_parser(
            "release-permit", help="force-release one permit of a semaphore (its TOKEN)"
        )
        permit.add_argument("name")
        permit.add_argument("token", help="the permit's owner token, from `semaphores NAME`")
        stats = actions.add_parser(
            "stats", help="held and waiting by group, and the hottest locks (as the gauges)"
        )
        stats.add_argument("--top", type=_positive, default=5, help="rows per list (5)")
        stats.add_argument("--json", action="store_true", dest="as_json", help="a JSON object")
        stats.add_argument(
            "--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
            help="again every SECONDS (2) until interrupted",
        )  # fmt: skip
        stats.add_argument("--rounds", type=_positive, help="with --watch: stop after N")
        acl = actions.add_parser(
            "acl", help="the ACL SETUSER command for a Redis user of the locks alone"
        )
        acl.add_argument("--user", default="locks", help="the user's name (locks)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action'].replace('-', '_')}")(**options)
        except (RedisError, LockBackendError) as exc:
            # One line, like the admin page and the guards, not redis-py's traceback.
            raise CommandError(
                f"Redis could not be reached: {exc}", returncode=UNREACHABLE
            ) from None

    def _list(
        self, *, match: str | None, limit: int | None, as_json: bool, **options: Any
    ) -> None:
        unreachable: list[str] = []
        found = itertools.islice(
            lock_registry.iter_locks(match=match, unreachable=unreachable), limit
        )
        locks = sorted(found, key=lambda info: info.name)  # SCAN's own order is no order
        missing = lock_registry.incomplete(unreachable)
        if as_json:
            self.stdout.write(_json([info.as_dict() for info in locks]))
            self._unread(missing, unreachable)
            return
        rows = [
            (info.name, info.label or "", info.holder, _job(info), str(info.waiting),
             readable_elapsed(info.held_for), readable(info.ttl) if info.expires else "never",
             str(info.fencing_token or ""))
            for info in locks
        ]  # fmt: skip
        header = ("NAME", "LABEL", "HOLDER", "TASK", "WAITING", "AGE", "TTL", "FENCE")
        for line in lines.table(header, rows):
            self.stdout.write(line)
        if lines.cut_any(rows):
            self.stderr.write(
                f"Cells longer than {lines.CELL_WIDTH} characters end in {lines.CUT}: "
                "`redis_locks show NAME` and `--json` print them whole."
            )
        if not rows and missing is None:
            self.stderr.write("No locks are held.")
        for warning in lock_registry.eviction_warnings():
            self.stderr.write(f"Warning: {warning}")
        self._unread(missing, unreachable)

    def _acl(self, *, user: str, **options: Any) -> None:
        self.stdout.write(f"ACL SETUSER {user} on >PASSWORD {acl_rule()}")
        self.stderr.write(
            "Replace PASSWORD; give the user a cache alias of its own (the cache's own keys are "
            "not in the rule) and point DJANGO_REDIS_LOCK_CACHE_ALIAS at it. See "
            f"{docs_page('servers.md')}"
        )

    def _unread(self, missing: str | None, unreachable: list[str]) -> None:
        """Say which servers of a quorum could not be read; fail when that may hide locks."""
        if missing is not None:
            raise CommandError(f"The list may be incomplete: {missing}", returncode=UNREACHABLE)
        if unreachable:
            self.stderr.write(
                "Warning: not read (a majority was, so no lock is missing): "
                + "; ".join(unreachable)
            )

    def _show(self, *, name: str, as_json: bool, **options: Any) -> None:
        info = self._held(name)
        if as_json:
            self.stdout.write(_json(info.as_dict()))
            return
        for field, value in info.as_dict().items():
            self.stdout.write(f"{field:14} {'' if value is None else value}")

    def _release(self, *, name: str, token: str | None, yes: bool, **options: Any) -> None:
        if token is None:
            info = self._held(name)
            token = info.token
            if not yes:
                label = info.label or "no label"
                question = f"Release {name!r}, held by {info.holder} ({label})? [y/N] "
                if not sys.stdin.isatty():
                    raise CommandError("Not released: confirm with --yes (no terminal to ask).")
                if input(question).strip().lower() not in {"y", "yes"}:
                    raise CommandError("Not released.")
        try:
            released = lock_registry.force_release(name, token, by="manage.py redis_locks")
        except ValueError as exc:  # not a lock: nothing was deleted
            raise CommandError(f"Not released: {exc}") from None
        if not released:
            raise CommandError(
                f"Not released: {name!r} is no longer held with token {token} (it was released "
                "or changed hands). Nothing was deleted."
            )
        self.stdout.write(f"Released {name!r}.")

    def _semaphores(
        self, *, name: str | None, match: str | None, as_json: bool, **options: Any
    ) -> None:
        printed, note = lines.semaphores(name, match, as_json)
        for line in printed:
            self.stdout.write(line)
        if note:
            self.stderr.write(note)

    def _release_permit(self, *, name: str, token: str, **options: Any) -> None:
        self.stdout.write(lines.release_permit(name, token, "manage.py redis_locks"))

    def _stats(
        self, *, top: int, as_json: bool, watch: float | None, rounds: int | None,
        **options: Any,
    ) -> None:  # fmt: skip
        if watch is not None and not watch > 0:
            raise CommandError("--watch takes a number of seconds above 0.")
        if rounds is not None and watch is None:
            raise CommandError("--rounds goes with --watch.")
        done = 0
        while True:
            found = census.take_census()
            if watch is not None and self.stdout.isatty():
                self.stdout.write("\x1b[H\x1b[2J", ending="")  # a screen, redrawn
            printed = [_json(lines.stats_dict(found, top))] if as_json else lines.stats(found, top)
            for line in printed:
                self.stdout.write(line)
            done += 1
            if watch is None or done == rounds:
                return
            try:
                time.sleep(watch)
            except KeyboardInterrupt:
                return

    def _held(self, name: str) -> lock_registry.LockInfo:
        info = lock_registry.get_lock(name)
        if info is None:
            raise CommandError(f"No lock named {name!r} is held.")
        return info


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True)
