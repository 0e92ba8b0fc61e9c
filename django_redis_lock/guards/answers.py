"""The answers ``@prevent_double_submit`` gives in the view's stead: the default
duplicate-submission view (409 Conflict or 422 Unprocessable Content, with ``Retry-After``;
``DJANGO_REDIS_LOCK_DUPLICATE_SUBMISSION_VIEW`` replaces it), and whether a client asked for
JSON, the one choice that all of them (the 503 when Redis is down too) make alike, so that an
API client gets JSON from all of them or from none.

The HTML page is ``django_redis_lock/duplicate_submission.html`` when one of the project's
template engines finds it (a project may override it), else the same page built here: a project
with no Django template engine (an API, or Jinja2 only) still answers 409 or 422, never a 500
for a template it does not have. So no system check asks for a template engine.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import TemplateDoesNotExist
from django.template.defaultfilters import pluralize
from django.template.loader import get_template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .submissions import DuplicateSubmission

__all__ = ["duplicate_submission", "wants_json"]

TEMPLATE = "django_redis_lock/duplicate_submission.html"


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
        response = HttpResponse(_page(request, exception), status=exception.status)
    else:
        response = JsonResponse(
            {"error": "duplicate_submission", "detail": str(exception)}, status=exception.status
        )
    if exception.retry_after is not None:
        response.headers["Retry-After"] = str(exception.retry_after)
    return response


def _page(request: HttpRequest, exception: DuplicateSubmission) -> str:
    """The template, rendered by whichever engine finds it; the built-in page when none does."""
    try:
        template = get_template(TEMPLATE)
    except TemplateDoesNotExist:
        return _built_in_page(exception)
    return template.render({"exception": exception, "status": exception.status}, request)


# The template's page, for projects whose engines do not find it: keep the two alike.
_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{}</title>
  <style>
    body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 36rem; margin: 4rem auto;
           padding: 0 1rem; color: #1d2733; }}
    @media (prefers-color-scheme: dark) {{ body {{ background: #121619; color: #dce3ea; }} }}
  </style>
</head>
<body>
  <h1>{}</h1>
  <p>{}</p>
</body>
</html>
"""


def _built_in_page(exception: DuplicateSubmission) -> SafeString:
    """The page without a template engine (``format_html``: every value escaped)."""
    if exception.status == 422:
        return format_html(
            _PAGE,
            "Request does not match",
            "This request does not match the earlier one",
            "The same idempotency key was already used for a different request.",
        )
    retry = ""
    if exception.retry_after:
        seconds = exception.retry_after
        retry = f"; if it did not go through, try again in {seconds} second{pluralize(seconds)}"
    return format_html(
        _PAGE,
        "Already submitted",
        "Already submitted",
        "This form was just submitted and is being (or has just been) processed. There is no "
        f"need to submit it again{retry}.",
    )
