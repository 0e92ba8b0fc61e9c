"""Create the demo's admin user (demo / demo), only when the demo settings allow it."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create the demo superuser (only with DEMO_SUPERUSER = True in settings)."

    def handle(self, *args, **options):
        if not getattr(settings, "DEMO_SUPERUSER", False):
            raise CommandError("DEMO_SUPERUSER is not enabled in these settings.")
        user_model = get_user_model()
        if not user_model.objects.filter(username="demo").exists():
            user_model.objects.create_superuser("demo", "demo@example.com", "demo")
        self.stdout.write("demo superuser: demo / demo")
