"""The package's migrations, run for real on the test database."""

from __future__ import annotations

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

APP = "django_redis_lock"
LATEST = "0002_rename_lock_heldlock"


def migrate_to(migration: str) -> Apps:
    """Our app at ``migration``, every other app at its latest; the models as they are then."""
    executor = MigrationExecutor(connection)
    others = [node for node in executor.loader.graph.leaf_nodes() if node[0] != APP]
    executor.migrate([(APP, migration)])
    executor.loader.build_graph()
    return executor.loader.project_state([*others, (APP, migration)]).apps


@pytest.mark.django_db(transaction=True)
def test_renaming_the_admin_model_keeps_who_may_view_the_locks_page():
    """0002 renames the model Lock -> HeldLock: a user granted ``view_lock`` before holds
    ``view_heldlock`` after, and ``release_lock`` is untouched."""
    old = migrate_to("0001_initial")
    try:
        content_type = old.get_model("contenttypes", "ContentType").objects.get_or_create(
            app_label=APP, model="lock"
        )[0]
        permissions = old.get_model("auth", "Permission").objects
        old.get_model("auth", "User").objects.create(username="ops").user_permissions.add(
            *(
                permissions.get_or_create(
                    content_type=content_type, codename=codename, defaults={"name": codename}
                )[0]
                for codename in ("view_lock", "release_lock")
            )
        )
        new = migrate_to(LATEST)
        user = new.get_model("auth", "User").objects.get(username="ops")
        granted = set(user.user_permissions.values_list("codename", flat=True))
        assert granted == {"view_heldlock", "release_lock"}
        assert (
            new.get_model("contenttypes", "ContentType")
            .objects.filter(app_label=APP, model="heldlock")
            .exists()
        )
    finally:
        migrate_to(LATEST)
