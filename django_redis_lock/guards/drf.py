"""What ``@prevent_double_submit`` needs of Django REST framework, for a handler of an
``APIView`` or ``ViewSet`` (``method_decorator``) or an ``@api_view`` function it decorates.

Such a handler runs inside ``APIView.dispatch``: it receives DRF's ``Request`` and returns a
``Response`` that DRF only gives its renderer after the handler, in ``finalize_response``.

DRF is an optional dependency and is never imported here: only one the process already uses is
asked (a DRF request or response cannot exist before DRF's modules are loaded).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from django.http import HttpResponseBase

__all__ = ["finalized", "is_request", "parsed_body", "unfinalized"]


def _loaded(module: str, name: str) -> Any:
    """``rest_framework.<module>.<name>`` if DRF is loaded, else None."""
    return getattr(sys.modules.get(f"rest_framework.{module}"), name, None)


def is_request(request: object) -> bool:
    """Whether ``request`` is DRF's ``Request`` (which wraps Django's ``HttpRequest``)."""
    request_class = _loaded("request", "Request")
    return request_class is not None and isinstance(request, request_class)


def unfinalized(response: object) -> bool:
    """Whether ``response`` is a DRF ``Response`` that no renderer was chosen for yet: it
    cannot be rendered (DRF's ``AssertionError: .accepted_renderer not set on Response``)."""
    response_class = _loaded("response", "Response")
    return (
        response_class is not None
        and isinstance(response, response_class)
        and getattr(response, "accepted_renderer", None) is None
    )


def finalized(
    request: Any, response: HttpResponseBase, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> HttpResponseBase:
    """``response`` finalised by its DRF view now, as ``APIView.dispatch`` does after the
    handler (content negotiation, renderer, the view's headers), so that it can be rendered and
    kept for duplicates; any other response as it is.

    DRF finalises it again when the handler returns, which changes nothing then: the renderer
    is chosen once per request, and the content was rendered already (drf-extensions'
    ``@cache_response`` relies on the same).
    """
    if not (unfinalized(response) and is_request(request)):
        return response
    view = (getattr(request, "parser_context", None) or {}).get("view")
    if view is None:  # a Request built by hand, outside a view: nothing to negotiate with
        return response
    return view.finalize_response(request, response, *args, **kwargs)  # type: ignore[no-any-return]


def parsed_body(request: Any) -> bytes:
    """The body of a DRF request whose stream its parsers already read (the CSRF check of
    ``SessionAuthentication`` reads ``request.POST``, say, which parses a JSON body): what they
    parsed, as canonical JSON (``request.body`` can no longer be read)."""
    data = request.data
    try:
        return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    except (TypeError, ValueError):  # keys that cannot be sorted: another parser's output
        return repr(data).encode()
