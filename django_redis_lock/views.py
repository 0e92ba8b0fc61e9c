"""Kept import path: ``django_redis_lock.views.duplicate_submission``, the default answer to a
duplicate submission (``guards/answers.py``), to name in
``DJANGO_REDIS_LOCK_DUPLICATE_SUBMISSION_VIEW`` or to call from a view of your own."""

from .guards.answers import duplicate_submission

__all__ = ["duplicate_submission"]
