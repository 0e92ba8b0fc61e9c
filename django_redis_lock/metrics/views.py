"""``metrics``: a ready ``/metrics`` view of the locks' Prometheus metrics.

    # urls.py
    from django_redis_lock.metrics.views import metrics

    urlpatterns = [..., path("metrics", metrics)]

It serves what this process's scrape should: ``prometheus_client``'s default registry (the
locks' counters and histograms, the census of what is held and waiting now, and whatever
else the project registered there), or under ``PROMETHEUS_MULTIPROC_DIR`` the sums of every
worker's files (``prometheus.exposition``). Who may read it, as a Django developer expects of
a page that shows what the admin shows:

- a logged-in user with the admin's "Can view held lock" permission (a superuser has it);
- a scraper that sends ``Authorization: Bearer <DJANGO_REDIS_LOCK_METRICS_TOKEN>``
  (Prometheus's ``authorization`` block), compared in constant time;
- nobody else: 401 with ``WWW-Authenticate: Bearer`` when nothing identifies the caller, 403
  for a user without the permission. Metrics name lock groups and views, which is enough to
  map a site: they are not public.

Importing this module never needs ``prometheus_client`` (an optional extra): the exporter is
imported at the first scrape, and a project without it is told which extra to install.
"""

from __future__ import annotations

import hmac

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..conf import lock_settings

__all__ = ["VIEW_PERMISSION", "metrics"]

# The admin's Locks page's own permission (models.HeldLock): who may see the locks may see
# their metrics.
VIEW_PERMISSION = "django_redis_lock.view_heldlock"


def _bearer_token(request: HttpRequest) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read the metrics; else the response that says why not."""
    expected = lock_settings.METRICS_TOKEN
    sent = _bearer_token(request)
    if sent is not None:
        if expected is not None and hmac.compare_digest(sent.encode(), expected.encode()):
            return None
        refusal = HttpResponse("The bearer token is not the metrics token.\n", status=401)
        refusal["WWW-Authenticate"] = 'Bearer realm="metrics", error="invalid_token"'
        return refusal
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if user.has_perm(VIEW_PERMISSION):
            return None
        return HttpResponse(
            f"Reading the lock metrics needs the {VIEW_PERMISSION} permission.\n", status=403
        )
    refusal = HttpResponse(
        "Log in as a user who may view the locks, or send "
        "Authorization: Bearer <DJANGO_REDIS_LOCK_METRICS_TOKEN>.\n",
        status=401,
    )
    refusal["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return refusal


def _exposition() -> tuple[bytes, str]:
    if "prometheus" not in lock_settings.METRICS:
        raise ImproperlyConfigured(
            "The lock metrics view serves Prometheus metrics, and DJANGO_REDIS_LOCK_METRICS "
            'does not name "prometheus": set DJANGO_REDIS_LOCK_METRICS = ["prometheus"].'
        )
    # An optional extra, imported when it is first needed (installed, since the setting
    # names it: the setting's validation checks that).
    from .prometheus import exposition

    return exposition()


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """The locks' metrics in Prometheus's text format, for a scraper with the token or a user
    who may view the locks."""
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    body, content_type = _exposition()
    return HttpResponse(body, content_type=content_type)
