"""``@prevent_double_submit(key=..., ...)``: a view, sync or async, against duplicate
submissions, over the plain cores in ``identities.py`` (who the client is, and whether it is
one person), ``submissions.py`` (what a submission is, what is kept of it) and ``replays.py``
(the budgets of the kept responses).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.template.response import SimpleTemplateResponse

from ..conf import lock_settings
from ..core import durations
from ..exceptions import LockBackendError, LockNotOwned
from ..hints import hinted
from ..primitives.lock import Claim, Lock
from . import drf, identities, replays, submissions
from .answers import duplicate_submission, wants_json

__all__ = ["prevent_double_submit"]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("django_redis_lock")

# How long, by default, a duplicate from a personal identity (a user, a session) waits for the
# first submission to finish and be shown its response: a double click's second request
# arrives while the first runs, and the browser shows the second response.
PERSONAL_WAIT = 10.0


class _SubmissionGuard:
    """The configuration of one ``@prevent_double_submit`` and everything but the I/O, which
    the sync and async wrappers do each their own way."""

    def __init__(
        self, *, key: Any, group: str, methods: Any, fingerprint: bool, wait: float | None,
        timeout: float | None, hold: float, replay: bool, idempotency_header: str | None,
        idempotency_ttl: float,
    ) -> None:  # fmt: skip
        self.key = identities.key_function(key)
        self.group = group
        self.methods = frozenset(
            m.upper() for m in ([methods] if isinstance(methods, str) else methods)
        )
        self.fingerprint = fingerprint
        self.wait = wait
        self.timeout = timeout
        self.hold = hold
        self.replay = replay
        self.idempotency_header = idempotency_header
        self.idempotency_ttl = idempotency_ttl

    def plan(self, request: HttpRequest) -> _Submission | None:
        """The lock for this request, or None when it is not guarded."""
        if request.method not in self.methods or not lock_settings.ENABLED:
            return None
        client = identities.identify(request, self.key)
        if client is None:
            return None  # nobody to tell apart (an anonymous user with key="user", say)
        # Only a personal identity is ever shown a kept response (identities.py): a shared
        # one (an IP, a header, a field) may be several people, who never see each other's.
        personal = identities.is_personal(client)
        idempotency_key = (
            request.headers.get(self.idempotency_header) if self.idempotency_header else None
        )
        fingerprint = (
            submissions.request_fingerprint(request) if self.fingerprint or idempotency_key else ""
        )
        scope = ("personal" if personal else "shared", client)
        if idempotency_key:
            name = submissions.submission_lock_name(self.group, *scope, "key", idempotency_key)
            keep = self.idempotency_ttl
        else:
            name = submissions.submission_lock_name(self.group, *scope, fingerprint)
            keep = self.hold
        lock = Lock(
            name,
            wait=self._wait(personal, idempotent=idempotency_key is not None),
            timeout=self.timeout,
            label=f"submission to {self.group}",
            group=f"view:{self.group}",
        )
        return _Submission(
            lock, fingerprint, keep, idempotency_key is not None, client,
            replayable=self.replay and personal,
        )  # fmt: skip

    def _wait(self, personal: bool, *, idempotent: bool) -> float:
        """How long a duplicate waits for the first submission to finish. Unless ``wait``
        says: a person's double click waits for the first (``PERSONAL_WAIT``) and is shown its
        response, as a browser shows the second of two responses; a shared identity's duplicate
        would only be shown 409 at the end, so it gets it at once; and an Idempotency-Key's
        retry gets 409 at once, as the IETF draft requires of a request still in progress."""
        if self.wait is not None:
            return self.wait
        if self.timeout is not None:  # a lease not renewed: it may end while the first runs,
            return 0  # and a duplicate waiting in line would then take it and run again
        return PERSONAL_WAIT if personal and self.replay and not idempotent else 0

    def refuse(self, request: HttpRequest, submission: _Submission, claim: Claim) -> Any:
        """The answer to a request that did not get the lock: the first response replayed,
        or what the duplicate-submission view says (a coroutine if that view is async)."""
        answer = self._duplicate(submission, claim)
        if isinstance(answer, HttpResponseBase):
            return answer
        return _duplicate_view()(request, answer)

    def _duplicate(
        self, submission: _Submission, claim: Claim
    ) -> submissions.DuplicateSubmission | HttpResponse:
        """Why a request that did not get the lock is not run, or the response to replay."""
        if claim.result is None:  # the first one is still running
            holder = claim.refusal
            assert holder is not None
            # Its lease (renewed, 30 s by default) says little about when it ends; a retry
            # after `hold` seconds is answered from its result if it finished by then.
            wait = min(holder.ttl, submission.keep) if holder.ttl else submission.keep
            return submissions.DuplicateSubmission(
                "The same submission is being processed.",
                status=409,
                retry_after=submissions.retry_after(wait),
            )
        finished = submissions.Finished.loads(claim.result)
        if submission.idempotent and finished.fingerprint != submission.fingerprint:
            return submissions.DuplicateSubmission(
                "This Idempotency-Key was used for a different request.",
                status=422,
                retry_after=None,
            )
        if finished.status is not None and submission.replayable:
            return finished.replay()
        return submissions.DuplicateSubmission(
            "The same submission was just processed.",
            status=409,
            retry_after=submissions.retry_after(submission.keep),
        )

    def result_of(
        self, response: HttpResponseBase, submission: _Submission
    ) -> submissions.Finished | None:
        """What to keep of the response for duplicates (None: nothing, a retry may run)."""
        if response.status_code >= 500:
            return None
        if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
            if drf.unfinalized(response):  # a DRF Response outside a DRF view: no renderer
                return submissions.Finished(submission.fingerprint)
            response.render()  # its content is what a duplicate must get
        return submissions.Finished.of(
            response, submission.fingerprint, replay=submission.replayable,
            max_bytes=lock_settings.REPLAY_MAX_BYTES,
        )  # fmt: skip

    def kept(self, finished: submissions.Finished | None, submission: _Submission) -> bytes | None:
        """``finished`` as it is kept, once its body is counted against the replay budgets
        (``replays.py``); without its body if that does not fit. Does I/O."""
        if finished is None:
            return None
        if finished.status is not None:
            record = finished.dumps()
            refused = replays.charge(
                lock_settings.CACHE_ALIAS, submission.client, len(record),
                durations.milliseconds(submission.keep),
            )  # fmt: skip
            if refused is None:
                return record
            logger.warning(
                "Not keeping the response of %s for replay: %s. Its duplicates get 409.",
                self.group, refused,
            )  # fmt: skip
            finished = finished.without_body()
        return finished.dumps()

    def unavailable(self, request: HttpRequest, error: LockBackendError) -> HttpResponse | None:
        """Redis is unreachable: None lets the view run unprotected (FAIL_OPEN), else a 503,
        in JSON for the clients the duplicate-submission view answers in JSON."""
        if lock_settings.FAIL_OPEN:
            logger.warning(
                "Running %s (%s) without double-submit protection: %s", self.group,
                request.path, error,
            )  # fmt: skip
            return None
        # The one trace of the refusal: the lock itself logs nothing when it cannot reach Redis.
        logger.warning(
            "Answering 503 to a submission to %s (%s), Redis is unavailable: %s",
            self.group, request.path, error,
        )  # fmt: skip
        detail = "Service unavailable, please try again."
        response: HttpResponse
        if wants_json(request):
            response = JsonResponse({"error": "service_unavailable", "detail": detail}, status=503)
        else:
            response = HttpResponse(detail, status=503, content_type="text/plain; charset=utf-8")
        response.headers["Retry-After"] = "5"
        return response


@dataclass(frozen=True)
class _Submission:
    lock: Lock
    fingerprint: str
    keep: float  # seconds the result is kept for duplicates
    idempotent: bool
    client: str  # who submits (the key's value; identities.py)
    replayable: bool  # whether duplicates may be shown a kept response: a personal identity


def _duplicate_view() -> Callable[..., Any]:
    return lock_settings.DUPLICATE_SUBMISSION_VIEW or duplicate_submission


@hinted
def prevent_double_submit(
    key: str | Callable[[HttpRequest], str | None] = "user_or_ip",
    *,
    group: str | None = None,
    methods: Any = submissions.UNSAFE,
    fingerprint: bool = True,
    wait: float | None = None,
    timeout: float | None = None,
    hold: float = 5,
    replay: bool = True,
    idempotency_header: str | None = None,
    idempotency_ttl: float = 24 * 3600,
) -> Callable[[F], F]:
    """Run a view at most once for the same submission from the same client.

    See ``docs/views.md``. In short: the same client (by ``key``) submitting the same thing
    (method, path, query and submitted data) to the same view ``group`` runs it once. Who is
    shown the first response decides the rest: a *personal* identity (a logged-in user, a
    session, a key function's :class:`PersonalIdentity`) is one person, whose duplicate waits
    for the first request (up to ``wait`` seconds, 10 by default) and is shown its response,
    replayed (``Idempotent-Replayed: true``), for ``hold`` seconds after it finished; a
    *shared* one (an IP address, a header, a form or query field, a key function's plain
    ``str``) may be several people, who never see each other's response: a duplicate gets 409
    Conflict with Retry-After. With ``idempotency_header="Idempotency-Key"`` a request carrying
    that header is identified by it instead (kept ``idempotency_ttl`` seconds; a retry while
    the first runs gets 409; a different payload under a used key gets 422). On Django REST
    framework, decorate the handler (``method_decorator`` on an ``APIView`` or ``ViewSet``, or
    below ``@api_view``).
    """
    Lock("validate-options", wait=wait, timeout=timeout)
    identities.key_function(key)  # a bad key fails here, at import time, not per request
    hold = durations.seconds(hold, "hold")
    idempotency_ttl = durations.seconds(idempotency_ttl, "idempotency_ttl")

    def decorator(view: F) -> F:
        guard = _SubmissionGuard(
            key=key, group=group or f"{view.__module__}.{view.__qualname__}", methods=methods,
            fingerprint=fingerprint, wait=wait, timeout=timeout, hold=hold, replay=replay,
            idempotency_header=idempotency_header, idempotency_ttl=idempotency_ttl,
        )  # fmt: skip

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                # In a thread: who submits may need the database (request.user, the session).
                submission = await sync_to_async(guard.plan)(request)
                if submission is None:
                    return await view(request, *args, **kwargs)
                try:
                    claim = await submission.lock.aclaim(want_result=True)
                except LockBackendError as error:
                    fallback = guard.unavailable(request, error)
                    return fallback or await view(request, *args, **kwargs)
                if not claim.acquired:
                    refusal = guard.refuse(request, submission, claim)
                    return await refusal if asyncio.iscoroutine(refusal) else refusal
                result = None
                try:
                    # As below (adrf's async DRF views have the same finalize_response).
                    response = drf.finalized(
                        request, await view(request, *args, **kwargs), args, kwargs
                    )
                    finished = guard.result_of(response, submission)
                    result = await sync_to_async(guard.kept, thread_sensitive=False)(
                        finished, submission
                    )
                    return response
                finally:
                    with contextlib.suppress(LockNotOwned, LockBackendError):
                        await submission.lock.arelease(result=result, result_ttl=submission.keep)

            return async_guarded  # type: ignore[return-value]

        @functools.wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            submission = guard.plan(request)
            if submission is None:
                return view(request, *args, **kwargs)
            try:
                claim = submission.lock.claim(want_result=True)
            except LockBackendError as error:
                fallback = guard.unavailable(request, error)
                return fallback or view(request, *args, **kwargs)
            if not claim.acquired:
                return guard.refuse(request, submission, claim)
            result = None
            try:
                # A DRF handler's Response gets its renderer here, not after us: it is rendered
                # and kept for duplicates before APIView.dispatch sees it.
                response = drf.finalized(request, view(request, *args, **kwargs), args, kwargs)
                result = guard.kept(guard.result_of(response, submission), submission)
                return response
            finally:
                # Nothing is kept when the view raised: a retry may run it again. A lost lock
                # was reported when it was lost; an unreachable Redis lets the lease end.
                with contextlib.suppress(LockNotOwned, LockBackendError):
                    submission.lock.release(result=result, result_ttl=submission.keep)

        return guarded  # type: ignore[return-value]

    return decorator


class PreventDoubleSubmitMixin:
    """``@prevent_double_submit`` for a class-based view (sync or async):

        class CheckoutView(PreventDoubleSubmitMixin, FormView):
            double_submit = {"key": "user", "hold": 10}

    ``double_submit`` holds the decorator's options; the group defaults to the view class's
    dotted name. Safe methods pass through as with the decorator.
    """

    double_submit: ClassVar[dict[str, Any]] = {}

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        guarded = type(self).__dict__.get("_guarded_dispatch")
        if guarded is None:
            guarded = self._guard_dispatch()
            type.__setattr__(type(self), "_guarded_dispatch", guarded)
        return guarded(request, *args, view=self, **kwargs)

    @classmethod
    def _guard_dispatch(cls) -> Callable[..., Any]:
        options = {"group": f"{cls.__module__}.{cls.__qualname__}", **cls.double_submit}

        if getattr(cls, "view_is_async", False):

            async def dispatch_async(request: Any, *args: Any, view: Any, **kwargs: Any) -> Any:
                parent = super(PreventDoubleSubmitMixin, view)
                return await parent.dispatch(request, *args, **kwargs)  # type: ignore[attr-defined]

            return prevent_double_submit(**options)(dispatch_async)

        def dispatch(request: Any, *args: Any, view: Any, **kwargs: Any) -> Any:
            return super(PreventDoubleSubmitMixin, view).dispatch(request, *args, **kwargs)  # type: ignore[misc]

        return prevent_double_submit(**options)(dispatch)
