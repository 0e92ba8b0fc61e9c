"""Who submits a request, for ``@prevent_double_submit``: the ``key`` option turned into a
function of the request, and whether the identity it gives is *personal* or *shared*.

The threat model (docs/views.md, "Who may be replayed a response"): a response kept for
duplicates is shown only to a request whose identity is **personal**, one person's and proven by
them: an authenticated user, a session (a cookie the server chose). Every other identity is
**shared**, because several people can present it or the sender chooses it: an IP address (an
office, a carrier's NAT), any header (``X-Real-IP``, ``X-Client``), a form or query field, and a
key function's value, unless the function returns a :class:`PersonalIdentity`. Two people
behind one shared identity who submit the same thing get 409 instead of each other's response.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest
from django.utils.module_loading import import_string

__all__ = ["KeyFunction", "PersonalIdentity", "identify", "is_personal", "key_function"]


class PersonalIdentity(str):
    """A key function's value that names one person, proven by the request: return it from a
    ``key`` callable to have duplicates replayed the first response (a plain ``str`` is taken
    for a shared identity, which never is)::

        def api_client(request):
            token = request.auth  # DRF: authenticated by its API token
            return PersonalIdentity(f"api-client:{token.client_id}") if token else None

        @prevent_double_submit(key=api_client)
        def create_order(request): ...

    Return it only for what the client cannot choose or share: an authenticated principal, a
    signed token's subject. Never for an address, a header or a field the client sends as it
    likes (another could send the same value, and be shown the response of the first).
    """

    __slots__ = ()


KeyFunction = Callable[[HttpRequest], "str | None"]


def is_personal(identity: str) -> bool:
    """Whether ``identity`` (from :func:`identify`) may be replayed the responses it got."""
    return isinstance(identity, PersonalIdentity)


def _ip(request: HttpRequest) -> str | None:
    address = request.META.get("REMOTE_ADDR")
    return f"ip:{address}" if address else None


def _user(request: HttpRequest) -> PersonalIdentity | None:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return PersonalIdentity(f"user:{user.pk}")
    return None


def _session(request: HttpRequest) -> PersonalIdentity | None:
    session = getattr(request, "session", None)
    if session is None:
        return None
    # The key a request sends is its claim until the session is loaded: loading drops a key
    # the store does not know (Django makes a new one), so a made-up or planted cookie value
    # is no one's identity. (One more read of the store where nothing loaded it before.)
    session.keys()
    key = session.session_key
    return PersonalIdentity(f"session:{key}") if key else None


_NAMED_KEYS: dict[str, KeyFunction] = {
    "ip": _ip,
    "user": _user,
    "session": lambda request: _session(request) or _ip(request),
    "user_or_ip": lambda request: _user(request) or _ip(request),
}


def _header(name: str) -> KeyFunction:
    def from_header(request: HttpRequest) -> str | None:
        value = request.headers.get(name)
        return f"header:{name.lower()}:{value}" if value else None

    return from_header


def _field(kind: str, name: str) -> KeyFunction:
    def from_data(request: HttpRequest) -> str | None:
        value = (request.POST if kind == "post" else request.GET).get(name)
        return f"{kind}:{name}:{value}" if value else None

    return from_data


def key_function(key: str | KeyFunction) -> KeyFunction:
    """Turn a ``key`` argument into a function of the request (checked when decorating)."""
    if callable(key):
        return key
    if not isinstance(key, str):
        raise TypeError(f"key must be a string or a callable, not {type(key).__name__}.")
    if key in _NAMED_KEYS:
        return _NAMED_KEYS[key]
    kind, _, name = key.partition(":")
    if name and kind == "header":
        return _header(name)
    if name and kind in {"post", "get"}:
        return _field(kind, name)
    if "." in key:
        function = import_string(key)
        if not callable(function):
            raise TypeError(f"key {key!r} does not name a callable.")
        return function  # type: ignore[no-any-return]
    raise ValueError(
        f"Unknown key {key!r}: use 'user', 'session', 'ip', 'user_or_ip', 'header:NAME', "
        "'post:FIELD', 'get:FIELD', a callable(request), or a dotted path to one."
    )


def identify(request: HttpRequest, key: KeyFunction) -> str | None:
    """Who submits: the key's value for this request, or None (then nothing is guarded). A
    :class:`PersonalIdentity` stays one (:func:`is_personal`); any other value is shared."""
    value = key(request)
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)
