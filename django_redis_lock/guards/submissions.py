"""What counts as "the same submission", and what is kept of the first one.

The plain core of ``@prevent_double_submit`` (in ``double_submit.py``): who the client is (the
``key``), a fingerprint of what was submitted, the lock name built from both, and the record
of a finished submission that later duplicates are answered from.

Identifying parts (user ids, session keys, IP addresses, header values) only ever reach Redis
hashed: the lock names are listed in the admin.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.http.request import RawPostDataException
from django.utils.module_loading import import_string

from . import drf

__all__ = [
    "ALL",
    "UNSAFE",
    "DuplicateSubmission",
    "Finished",
    "client_identity",
    "ip_scoped",
    "key_function",
    "request_fingerprint",
    "retry_after",
    "submission_lock_name",
]

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ALL = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", *UNSAFE})

KeyFunction = Callable[[HttpRequest], "str | None"]

# Never part of a fingerprint: it changes with every render of the same form.
_IGNORED_FIELDS = frozenset({"csrfmiddlewaretoken"})


class DuplicateSubmission(Exception):
    """Given to the duplicate-submission view: why this request was not run.

    ``status`` is 409 (the first submission is still running, or finished moments ago and its
    response is not replayable) or 422 (an Idempotency-Key reused with a different payload);
    ``retry_after`` the seconds after which a retry may run (None: never, for 422).
    """

    def __init__(self, message: str, *, status: int, retry_after: int | None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def _ip(request: HttpRequest) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


def _user(request: HttpRequest) -> str | None:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return None


def _session(request: HttpRequest) -> str | None:
    session = getattr(request, "session", None)
    key = getattr(session, "session_key", None)
    return f"session:{key}" if key else None


_NAMED_KEYS: dict[str, KeyFunction] = {
    "ip": lambda request: f"ip:{_ip(request)}" if _ip(request) else None,
    "user": _user,
    "session": lambda request: (
        _session(request) or (f"ip:{_ip(request)}" if _ip(request) else None)
    ),
    "user_or_ip": lambda request: (
        _user(request) or (f"ip:{_ip(request)}" if _ip(request) else None)
    ),
}


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
        return lambda request: (
            f"header:{request.headers[name]}" if request.headers.get(name) else None
        )
    if name and kind in {"post", "get"}:

        def from_data(request: HttpRequest) -> str | None:
            value = (request.POST if kind == "post" else request.GET).get(name)
            return f"{kind}:{value}" if value else None

        return from_data
    if "." in key:
        function = import_string(key)
        if not callable(function):
            raise TypeError(f"key {key!r} does not name a callable.")
        return function  # type: ignore[no-any-return]
    raise ValueError(
        f"Unknown key {key!r}: use 'user', 'session', 'ip', 'user_or_ip', 'header:NAME', "
        "'post:FIELD', 'get:FIELD', a callable(request), or a dotted path to one."
    )


def ip_scoped(client: str) -> bool:
    """Whether ``client`` (an identity from a key function) is only an IP address, which
    several people may share: their responses are never replayed to each other."""
    return client.startswith("ip:")


def client_identity(request: HttpRequest, key: KeyFunction) -> str | None:
    """Who submits: the key's value for this request, or None (then nothing is guarded)."""
    value = key(request)
    return None if value is None else str(value)


def request_fingerprint(request: HttpRequest) -> str:
    """A hash of what is submitted: method, path, query, form fields and uploaded files, or
    the body (JSON...). ``request`` may be Django REST framework's ``Request`` (whose ``POST``
    and ``FILES`` are what its parsers read).

    From ``request.POST`` and ``request.FILES``, not ``request.body``: once the CSRF middleware
    has read a multipart ``POST``, ``request.body`` can no longer be read.
    """
    digest = hashlib.sha256()

    def feed(*parts: str | bytes) -> None:
        for part in parts:
            data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
            digest.update(b"%d:" % len(data))
            digest.update(data)

    feed(request.method or "", request.path, request.META.get("QUERY_STRING", ""))
    content_type = request.META.get("CONTENT_TYPE", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        for name, values in sorted(request.POST.lists()):
            if name not in _IGNORED_FIELDS:
                feed(name, *values)
        for name, files in sorted(request.FILES.lists()):
            for upload in files:
                file_hash = hashlib.sha256()
                for chunk in upload.chunks():
                    file_hash.update(chunk)
                upload.seek(0)  # the view reads it next
                feed(name, upload.name or "", str(upload.size), file_hash.hexdigest())
    else:  # JSON and other bodies
        feed(_body(request))
    return digest.hexdigest()


def _body(request: HttpRequest) -> bytes:
    """The body as received; of a DRF request whose parsers read it already, what they parsed."""
    try:
        return request.body
    except RawPostDataException:
        if not drf.is_request(request):
            raise
        return drf.parsed_body(request)


def submission_lock_name(group: str, *parts: str) -> str:
    """``submit:<group>:<hash>``: readable where it may be, hashed where it must be."""
    hashed = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"submit:{group}:{hashed[:32]}"


@dataclass(frozen=True)
class Finished:
    """What is kept of a finished submission, for the duplicates that follow it."""

    fingerprint: str
    status: int | None = None  # None: the response is not replayed (too large, streaming...)
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def of(
        cls, response: HttpResponseBase, fingerprint: str, *, replay: bool, max_bytes: int
    ) -> Finished:
        if (
            replay
            and isinstance(response, HttpResponse)
            and not isinstance(response, StreamingHttpResponse)
            and len(response.content) <= max_bytes
        ):
            # Cookies are not headers in Django (response.cookies), and are never replayed:
            # a duplicate must not receive the first request's session or CSRF cookie.
            headers = tuple(
                (name, value)
                for name, value in response.headers.items()
                if name.lower() not in {"set-cookie", "content-length"}
            )
            return cls(fingerprint, response.status_code, headers, response.content)
        return cls(fingerprint)

    def without_body(self) -> Finished:
        """The same record, not replayable: its duplicates get 409."""
        return Finished(self.fingerprint)

    def dumps(self) -> bytes:
        return json.dumps(
            {
                "fingerprint": self.fingerprint,
                "status": self.status,
                "headers": self.headers,
                "body": base64.b64encode(self.body).decode() if self.status is not None else None,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def loads(cls, data: bytes) -> Finished:
        record = json.loads(data)
        body = base64.b64decode(record["body"]) if record.get("body") else b""
        headers = tuple((str(name), str(value)) for name, value in record.get("headers") or ())
        return cls(record["fingerprint"], record.get("status"), headers, body)

    def replay(self) -> HttpResponse:
        response = HttpResponse(self.body, status=self.status)
        for name, value in self.headers:
            response.headers[name] = value
        response.headers["Idempotent-Replayed"] = "true"
        return response


def retry_after(seconds: float | None) -> int:
    """Whole seconds for a Retry-After header: at least 1."""
    return max(1, math.ceil(seconds or 1))
