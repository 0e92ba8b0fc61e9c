"""The answers ``@prevent_double_submit`` gives in the view's stead: the default
duplicate-submission view (409 Conflict or 422 Unprocessable Content, with ``Retry-After``;
``DJANGO_REDIS_LOCK_DUPLICATE_SUBMISSION_VIEW`` replaces it), and whether a client asked for
JSON, the one choice that all of them (the 503 when Redis is down too) make alike, so that an
API client gets JSON from all of them or from none."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

from .submissions import DuplicateSubmission

__all__ = ["duplicate_submission", "wants_json"]


def wants_json(request: HttpRequest) -> bool:
    """JSON for a client that does not take HTML, or that names JSON and not HTML in its
    ``Accept``; not for browsers, nor for clients that send no ``Accept`` (which take anything).
    ``request`` may be Django REST framework's ``Request``."""
    if not request.accepts("text/html"):
        return True
    accept = request.headers.get("Accept", "")
    return "json" in accept and "html" not in accept


def duplicate_submission(request: HttpRequest, exception: DuplicateSubmission) -> HttpResponse:
    """The default answer to a duplicate: JSON for clients that ask for it, a small HTML page
    for browsers."""
    response: HttpResponse
    if not wants_json(request):
        html = render_to_string(
            "django_redis_lock/duplicate_submission.html",
            {"exception": exception, "status": exception.status},
            request=request,
        )
        response = HttpResponse(html, status=exception.status)
    else:
        response = JsonResponse(
            {"error": "duplicate_submission", "detail": str(exception)}, status=exception.status
        )
    if exception.retry_after is not None:
        response.headers["Retry-After"] = str(exception.retry_after)
    return response
