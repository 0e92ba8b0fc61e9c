"""The import paths users and their migrations hold keep working after the move into layers:
each kept path gives the very object the package now keeps elsewhere."""

from __future__ import annotations

import importlib

import pytest
from django.db.migrations.writer import MigrationWriter

import django_redis_lock

# (kept path, name, where it lives now), under django_redis_lock.
KEPT = [
    ("mixins", "LockableModelMixin", "mixins"),
    ("mixins", "PreventDoubleSubmitMixin", "guards.double_submit"),
    ("mixins", "release_after_transaction", "guards.transactions"),
    ("views", "duplicate_submission", "guards.answers"),
    ("conf", "lock_settings", "conf"),
    ("conf", "SETTINGS", "conf"),
    ("tasks", "guarded", "tasks"),
    ("tasks", "GuardedBackend", "tasks"),
    ("celery", "GuardedTask", "celery"),
    ("metrics.prometheus", "CensusCollector", "metrics.prometheus"),
    ("metrics.opentelemetry", "observe_census", "metrics.opentelemetry"),
] + [
    ("registry", name, "registry.locks")
    for name in (
        "LockInfo", "eviction_warnings", "force_release", "get_lock", "glob_escape", "iter_locks",
        "page", "release_job", "waiting",
    )
] + [
    ("registry", name, "registry.semaphores")
    for name in ("SemaphoreInfo", "force_release_permit", "get_semaphore", "iter_semaphores")
]  # fmt: skip


@pytest.mark.parametrize(("path", "name", "home"), KEPT)
def test_a_kept_path_gives_the_object_of_its_new_home(path, name, home):
    kept = importlib.import_module(f"django_redis_lock.{path}")
    assert getattr(kept, name) is getattr(
        importlib.import_module(f"django_redis_lock.{home}"), name
    )


@pytest.mark.parametrize("path", ["connection", "quorum"])
def test_the_shims_of_before_the_first_release_are_gone(path):
    """Nothing was released with them: one import path per module, not two (their objects are
    public from ``django_redis_lock`` itself)."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"django_redis_lock.{path}")
    assert not hasattr(django_redis_lock, "semaphore_registry")


def test_a_migration_names_the_model_mixin_by_its_kept_path():
    """A project's migrations write a model's bases by path: that path must stay importable."""
    written, imports = MigrationWriter.serialize(django_redis_lock.LockableModelMixin)
    assert written == "django_redis_lock.mixins.LockableModelMixin"
    assert imports == {"import django_redis_lock.mixins"}


def test_the_default_duplicate_view_setting_names_the_kept_path(settings):
    from django_redis_lock.conf import lock_settings

    settings.DJANGO_REDIS_LOCK_DUPLICATE_SUBMISSION_VIEW = (
        "django_redis_lock.views.duplicate_submission"
    )
    assert lock_settings.DUPLICATE_SUBMISSION_VIEW is django_redis_lock.views.duplicate_submission


@pytest.mark.parametrize("name", ["UnsupportedCache", "QuorumUnavailable"])
def test_the_errors_docs_name_are_public(name):
    assert name in django_redis_lock.__all__
