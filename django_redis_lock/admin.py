"""The admin "Locks" page: the locks and semaphores held right now, read from Redis with SCAN.

An unmanaged model (``models.HeldLock``, no table) gives the page its place on the admin index and
its permissions: ``view_heldlock`` to see it, ``release_lock`` to force-release. The list is never
read from the database: ``changelist_view`` pages through ``lock_registry.page()``. A release goes
through a confirmation page, is a POST (CSRF-protected), deletes a lock only if it still has
the token that was shown, and leaves an admin ``LogEntry``. A semaphore's page lists its
holders (``registry/semaphores.py``); one permit is force-released the same way.

The "Hot locks" page (``<changelist>/hot/``) is a census of the whole namespace
(``registry/census.py``, the figures the gauges export): most waiters now, oldest holds, leases
about to end, and held and waiting by group. It refreshes itself every few seconds until the user
turns that off (``?refresh=off``), as the list can be asked to (``?refresh=5``).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import Truncator
from redis.exceptions import RedisError

from . import admin_display as display
from .conf import lock_settings
from .core.durations import readable_elapsed
from .exceptions import LockBackendError
from .models import HeldLock
from .primitives.keys import lock_keys
from .registry import census
from .registry import locks as lock_registry
from .registry import semaphores as semaphore_registry

RELEASE_PERMISSION = "django_redis_lock.release_lock"
_TEMPLATES = "admin/django_redis_lock/heldlock/"
_HOT_REFRESH = 5  # seconds: the hot-locks page's default
_HOT_ROWS = 10
# The count above the list comes from a census; on a Redis of millions of keys, the list's own
# page stays quick, and the count stops after this many keys of ours and says "at least".
COUNT_MAX_KEYS = 100_000


def _not_a_reference(value: str, what: str) -> str:
    """The error for a release request's value that names no lease (``what``: "a lock")."""
    return (
        f"{Truncator(value).chars(120)!r} does not name {what} as this page writes one (its "
        "owner token, percent-encoded, then ':' and its name); it was left alone."
    )


class HeldLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Live locks, from Redis: list, search, detail, force-release."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RELEASE_PERMISSION))

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name=f"{name}_changelist"),
            path("show/", view(self.detail_view), name=f"{name}_detail"),
            path("release/", view(self.release_view), name=f"{name}_release"),
            path("semaphore/", view(self.semaphore_view), name=f"{name}_semaphore"),
            path("release-permit/", view(self.permit_release_view), name=f"{name}_permit"),
            path("hot/", view(self.hot_view), name=f"{name}_hot"),
        ]

    def _url(self, view: str) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{view}")

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "can_release": self.has_release_permission(request),
            "changelist_url": self._url("changelist"),
            "detail_url": self._url("detail"),
            "release_url": self._url("release"),
            "semaphore_url": self._url("semaphore"),
            "permit_release_url": self._url("permit"),
            "hot_url": self._url("hot"),
            **extra,
        }

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.get("q", "").strip()
        order = request.GET.get("o", "name")
        order = order if order in display.LIST_ORDERS else "name"
        refresh = display.refresh_seconds(request, 0)
        cursor = request.GET.get("cursor", "0")
        page_text = request.GET.get("p", "1")
        page_number = int(page_text) if page_text.isdigit() and int(page_text) > 0 else 1
        error = None
        scanned = 0
        unreachable: list[str] = []
        try:
            items, next_cursor, scanned = lock_registry.scan_page(
                cursor, lock_settings.ADMIN_PAGE_SIZE, match=query or None, unreachable=unreachable
            )
        except ValueError:  # a cursor from another list: start over
            items, next_cursor, page_number = [], "0", 1
            error = "That page is gone; start from the first one."
        except (RedisError, LockBackendError) as exc:
            items, next_cursor = [], None
            error = f"Redis could not be reached: {exc}"
        if error is None:
            for warning in lock_registry.eviction_warnings():
                self.message_user(request, warning, messages.WARNING)
        if unreachable:
            self.message_user(
                request,
                "Not all servers of the quorum could be read; the list shows what the others "
                f"hold. Unreachable: {'; '.join(unreachable)}",
                messages.WARNING,
            )
        # Sorted (by name unless asked): SCAN returns keys in no order, which may differ
        # between reloads.
        rows = [
            (info, readable_elapsed(info.held_for), display.lease_reference(info.token, info.name),
             display.breakable(info.name))
            for info in sorted(items, key=display.LIST_ORDERS[order])
        ]  # fmt: skip
        here, page = (cursor, page_number) if page_number > 1 else ("", "")
        semaphores = []
        if error is None and page_number == 1:  # few, and listed whole, on the first page
            try:
                found = semaphore_registry.iter_semaphores(match=query or None)
                semaphores = sorted(
                    itertools.islice(found, lock_settings.ADMIN_PAGE_SIZE), key=lambda s: s.name
                )
            except (RedisError, LockBackendError) as exc:
                error = f"Redis could not be reached: {exc}"
        # Held and waiting in all, not on this page only, for locks and semaphores each: what
        # Hot locks says, in the same words (the locks' waiters alone read as a smaller total).
        counted = None
        if error is None and (rows or next_cursor or semaphores):
            # The page was read: if the census fails, it is shown without the totals.
            with contextlib.suppress(RedisError, LockBackendError):
                counted = census.take_census(max_keys=COUNT_MAX_KEYS)
        # The task and fencing columns only when a lock on the page has one: most have none.
        show_tasks = any(info.job_id for info in items)
        show_fences = any(info.fencing_token for info in items)
        context = self._context(
            request,
            "Locks held now",
            rows=rows,
            query=query,
            page_number=page_number,
            next_cursor=next_cursor,
            error=error,
            page_size=lock_settings.ADMIN_PAGE_SIZE,
            scanned=scanned,
            census=counted,
            kinds=counted.by_kind(query) if counted else None,
            order=order,
            refresh=refresh,
            # Links that keep the page's search, order and refresh, changing one of them.
            sort_urls={
                name: display.query_string(q=query, o=name, refresh=refresh, cursor=here, p=page)
                for name in display.LIST_ORDERS
            },
            refresh_url=display.query_string(
                q=query, o=order, refresh="off" if refresh else 5, cursor=here, p=page
            ),
            keep_params="&" + display.query_string(q=query, o=order, refresh=refresh)[1:],
            show_tasks=show_tasks,
            show_fences=show_fences,
            semaphores=[
                (info, readable_elapsed(info.holders[0].held_for), display.breakable(info.name))
                for info in semaphores
            ],
            semaphores_cut=len(semaphores) == lock_settings.ADMIN_PAGE_SIZE,
        )
        return TemplateResponse(request, _TEMPLATES + "change_list.html", context)

    def hot_view(self, request: HttpRequest) -> HttpResponse:
        """Contention now: a census of every lock and semaphore (``registry/census.py``)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        found, error = None, None
        try:
            found = census.take_census()
        except (RedisError, LockBackendError) as exc:
            error = f"Redis could not be reached: {exc}"
        context = self._context(
            request,
            "Hot locks",
            census=found,
            kinds=found.by_kind() if found else None,
            error=error,
            most_waited=display.entry_rows(found.most_waited(_HOT_ROWS)) if found else [],
            oldest=display.entry_rows(found.oldest(_HOT_ROWS)) if found else [],
            ending=display.entry_rows(found.ending(_HOT_ROWS)) if found else [],
            groups=found.groups_by_contention() if found else [],
            refresh=display.refresh_seconds(request, _HOT_REFRESH),
            default_refresh=_HOT_REFRESH,
        )
        return TemplateResponse(request, _TEMPLATES + "hot.html", context)

    def detail_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        name = request.GET.get("name", "")
        info, error = self._read(name) if name else (None, None)
        waiting = info.waiting if info is not None else None  # read with its record
        keys = lock_keys(info.name, lock_settings.CACHE_ALIAS) if info is not None else None
        reference = display.lease_reference(info.token, info.name) if info else None
        context = self._context(
            request, name or "Lock", info=info, name=name,
            age=readable_elapsed(info.held_for) if info else None,
            error=error, waiting=waiting, keys=keys, reference=reference,
        )  # fmt: skip
        return TemplateResponse(request, _TEMPLATES + "detail.html", context)

    def semaphore_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        name = request.GET.get("name", "")
        info, error = None, None
        if name:
            try:
                info = semaphore_registry.get_semaphore(name)
            except (RedisError, LockBackendError) as exc:
                error = f"Redis could not be reached: {exc}"
        holders = [
            (holder, readable_elapsed(holder.held_for),
             display.lease_reference(holder.token, info.name))
            for holder in info.holders
        ] if info else []  # fmt: skip
        context = self._context(
            request,
            f"Semaphore {name}" if name else "Semaphore",
            info=info,
            name=name,
            error=error,
            holders=holders,
        )
        return TemplateResponse(request, _TEMPLATES + "semaphore.html", context)

    def permit_release_view(self, request: HttpRequest) -> HttpResponse:
        """Force-release one permit of a semaphore: confirmed, then POSTed."""
        if not self.has_release_permission(request):
            raise PermissionDenied
        data = request.POST if request.method == "POST" else request.GET
        value = data.get("permit", "")
        if not value:
            messages.warning(request, "No permit was selected.")
            return HttpResponseRedirect(self._url("changelist"))
        try:
            token, name = display.lease_from_reference(value)
        except ValueError:
            messages.error(request, _not_a_reference(value, "a permit"))
            return HttpResponseRedirect(self._url("changelist"))
        back = f"{self._url('semaphore')}?{urlencode({'name': name})}"
        if request.method != "POST" or data.get("confirm") != "yes":
            info, error = None, None
            try:
                info = semaphore_registry.get_semaphore(name)
            except (RedisError, LockBackendError) as exc:
                error = f"Redis could not be reached: {exc}"
            holder = next((h for h in info.holders if h.token == token), None) if info else None
            context = self._context(
                request, "Release a permit?", name=name, token=token, holder=holder,
                error=error, back_url=back, reference=value,
            )  # fmt: skip
            return TemplateResponse(request, _TEMPLATES + "permit_release.html", context)
        by = request.user.get_username()
        try:
            released = semaphore_registry.force_release_permit(name, token, by=by)
        except (RedisError, LockBackendError) as exc:
            messages.error(
                request, f"The permit was not released: Redis could not be reached ({exc})."
            )
            return HttpResponseRedirect(back)
        if released:
            LogEntry.objects.create(
                user_id=request.user.pk,
                content_type=ContentType.objects.get_for_model(HeldLock, for_concrete_model=False),
                object_id=name[:255],
                object_repr=f"semaphore {name}"[:200],
                action_flag=DELETION,
                change_message=f"Force-released a permit of the semaphore (token {token}).",
            )
            messages.success(request, f"Released a permit of semaphore {name!r}.")
        else:
            messages.warning(
                request, "The permit was not released: it was given back or ended since it was "
                "shown. Nothing was freed.",
            )  # fmt: skip
        return HttpResponseRedirect(back)

    @staticmethod
    def _read(name: str) -> tuple[lock_registry.LockInfo | None, str | None]:
        """The lock ``name`` as Redis has it now, or why it could not be read."""
        try:
            return lock_registry.get_lock(name), None
        except (RedisError, LockBackendError) as exc:
            return None, f"Redis could not be reached: {exc}"

    def release_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_release_permission(request):
            raise PermissionDenied
        data = request.POST if request.method == "POST" else request.GET
        chosen = []  # (name, token): the leases that were shown
        values = data.getlist("lock")
        for value in values:
            try:
                token, name = display.lease_from_reference(value)
            except ValueError:
                messages.error(request, _not_a_reference(value, "a lock"))
                continue
            chosen.append((name, token))
        changelist = self._url("changelist")
        if not chosen:
            if not values:
                messages.warning(request, "No lock was selected.")
            return HttpResponseRedirect(changelist)
        if request.method != "POST" or data.get("confirm") != "yes":
            infos, errors = [], []
            for name, token in chosen:
                info, error = self._read(name)
                infos.append((name, token, info, display.lease_reference(token, name)))
                errors += [error] if error else []
            context = self._context(
                request, "Release locks?", chosen=infos, error=errors[0] if errors else None
            )
            return TemplateResponse(request, _TEMPLATES + "release_confirmation.html", context)
        content_type = ContentType.objects.get_for_model(HeldLock, for_concrete_model=False)
        for name, token in chosen:
            try:
                released = lock_registry.force_release(name, token, by=request.user.get_username())
            except ValueError as exc:  # not a lock: nothing was deleted
                messages.error(request, str(exc))
                continue
            except (RedisError, LockBackendError) as exc:
                messages.error(
                    request, f"{name!r} was not released: Redis could not be reached ({exc})."
                )
                continue
            if released:
                LogEntry.objects.create(
                    user_id=request.user.pk,
                    content_type=content_type,
                    object_id=name[:255],
                    object_repr=name[:200],
                    action_flag=DELETION,
                    change_message=f"Force-released the lock (token {token}).",
                )
                messages.success(request, f"Released {name!r}.")
            else:
                messages.warning(
                    request,
                    f"{name!r} was not released: it changed hands or was released since it was "
                    "shown. Nothing was deleted.",
                )
        return HttpResponseRedirect(changelist)


if lock_settings.SHOW_ADMIN:
    admin.site.register(HeldLock, HeldLockAdmin)
