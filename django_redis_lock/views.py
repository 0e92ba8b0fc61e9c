"""The default answer to a duplicate submission (``DJANGO_REDIS_LOCK_DUPLICATE_SUBMISSION_VIEW``
replaces it): 409 Conflict or 422 Unprocessable Content, with ``Retry-After``, as JSON for
clients that ask for it and as a small HTML page for browsers."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

from .guards.negotiation import wants_json
from .guards.submissions import DuplicateSubmission

__all__ = ["duplicate_submission"]


def duplicate_submission(request: HttpRequest, exception: DuplicateSubmission) -> HttpResponse:
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
