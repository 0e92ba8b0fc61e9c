from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Lock",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=255, primary_key=True, serialize=False, verbose_name="name"
                    ),
                ),
            ],
            options={
                "verbose_name": "lock",
                "verbose_name_plural": "locks",
                "permissions": [("release_lock", "Can force-release a lock")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
