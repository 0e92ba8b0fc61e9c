"""The admin's model was called ``Lock``, like the lock class: now ``HeldLock``. Its table never
existed (unmanaged); the content type follows the rename (django.contrib.contenttypes does
that), and the permission to view it keeps whom it was granted to, under its new codename."""

from django.apps import apps as global_apps
from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

OLD, NEW = "view_lock", "view_heldlock"


def rename_view_permission(
    apps: Apps, schema_editor: BaseDatabaseSchemaEditor, old: str = OLD, new: str = NEW
) -> None:
    try:
        permission = apps.get_model("auth", "Permission")
    except LookupError:  # django.contrib.auth is not installed: no permissions to rename
        return
    ours = permission.objects.using(schema_editor.connection.alias).filter(
        content_type__app_label="django_redis_lock"
    )
    if not ours.filter(codename=new).exists():
        ours.filter(codename=old).update(codename=new)


def restore_view_permission(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    rename_view_permission(apps, schema_editor, old=NEW, new=OLD)


class Migration(migrations.Migration):
    dependencies = [("django_redis_lock", "0001_initial")]
    if global_apps.is_installed("django.contrib.auth"):
        dependencies.append(("auth", "0001_initial"))

    operations = [
        migrations.RenameModel("Lock", "HeldLock"),
        migrations.RunPython(rename_view_permission, restore_view_permission, elidable=True),
    ]
