"""Whether a client asked for JSON: the one choice that the answers ``@prevent_double_submit``
gives in the view's stead (the duplicate-submission view's 409/422, the 503 when Redis is
down) make alike, so that an API client gets JSON from all of them or from none."""

from __future__ import annotations

from django.http import HttpRequest

__all__ = ["wants_json"]


def wants_json(request: HttpRequest) -> bool:
    """JSON for a client that does not take HTML, or that names JSON and not HTML in its
    ``Accept``; not for browsers, nor for clients that send no ``Accept`` (which take anything).
    ``request`` may be Django REST framework's ``Request``."""
    if not request.accepts("text/html"):
        return True
    accept = request.headers.get("Accept", "")
    return "json" in accept and "html" not in accept
