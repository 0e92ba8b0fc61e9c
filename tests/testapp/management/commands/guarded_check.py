"""An existing command class made single-instance with the mixin."""

from django.core.management.commands.check import Command as CheckCommand

from django_redis_lock import SingleInstanceMixin


class Command(SingleInstanceMixin, CheckCommand):
    pass
