"""What counts as "the same submission", and what is kept of the first one.

The plain core of ``@prevent_double_submit`` (in ``double_submit.py``): a fingerprint of what
was submitted, the lock name built from it and the client's identity (``identities.py``), and
the record of a finished submission that later duplicates are answered from.

Identifying parts (user ids, session keys, IP addresses, header values) only ever reach Redis
hashed: the lock names are listed in the admin.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.http.request import RawPostDataException

from . import drf

__all__ = [
    "ALL",
    "UNSAFE",
    "DuplicateSubmission",
    "Finished",
    "request_fingerprint",
    "retry_after",
    "submission_lock_name",
]

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ALL = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", *UNSAFE})

# Never part of a fingerprint: it changes with every render of the same form.
_IGNORED_FIELDS = frozenset({"csrfmiddlewaretoken"})
_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")


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


def request_fingerprint(request: HttpRequest) -> str:
    """A hash of what is submitted: method, path, query, form fields and uploaded files, or
    the body (JSON...) and its content type. ``request`` may be Django REST framework's
    ``Request`` (whose ``POST`` and ``FILES`` are what its parsers read).

    From ``request.POST`` and ``request.FILES``, not ``request.body``: once the CSRF middleware
    has read a multipart ``POST``, ``request.body`` can no longer be read.

    Two submissions that differ in anything the view reads there never share a fingerprint:
    what is hashed is one JSON document of it (``_digest``), and a JSON document is read back
    in one way only, so every field keeps its own list of values (``tag=a&tag=b`` is not
    ``tag=a&b=``...), whatever the names and values contain. A form sent urlencoded or as
    multipart is the same submission.
    """
    content_type = request.META.get("CONTENT_TYPE", "")
    submitted: list[object]
    if _parsed_form(request, content_type):
        fields = [
            [name, values]
            for name, values in sorted(request.POST.lists())
            if name not in _IGNORED_FIELDS
        ]
        files = [
            [name, [[upload.name or "", upload.size, _file_hash(upload)] for upload in uploads]]
            for name, uploads in sorted(request.FILES.lists())
        ]
        submitted = ["form", fields, files]
    else:  # JSON and other bodies
        submitted = ["body", content_type, hashlib.sha256(_body(request)).hexdigest()]
    return _digest(
        [request.method or "", request.path, request.META.get("QUERY_STRING", ""), submitted]
    )


def _parsed_form(request: HttpRequest, content_type: str) -> bool:
    """Whether the submission is read from ``request.POST``: a form that Django parses there
    (a POST's only: a PUT's form stays in the body), or DRF (whose parsers read any method's)."""
    return content_type.startswith(_FORMS) and (
        request.method == "POST" or drf.is_request(request)
    )


def _digest(parts: list[object]) -> str:
    """SHA-256 of ``parts`` as one JSON document: injective for lists of str, int and lists
    (``ensure_ascii`` writes every character, lone surrogates too, as an escape)."""
    document = json.dumps(parts, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(document.encode("ascii")).hexdigest()


def _file_hash(upload: Any) -> str:
    file_hash = hashlib.sha256()
    for chunk in upload.chunks():
        file_hash.update(chunk)
    upload.seek(0)  # the view reads it next
    return file_hash.hexdigest()


def _body(request: HttpRequest) -> bytes:
    """The body as received; of a DRF request whose parsers read it already, what they parsed."""
    try:
        return request.body
    except RawPostDataException:
        if not drf.is_request(request):
            raise
        return drf.parsed_body(request)


def submission_lock_name(group: str, *parts: str) -> str:
    """``submit:<group>:<hash>``: readable where it may be, hashed where it must be. Different
    ``parts`` (the identity, whether it is personal, the fingerprint or Idempotency-Key) never
    give the same name, whatever they contain."""
    return f"submit:{group}:{_digest(list(parts))[:32]}"


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
