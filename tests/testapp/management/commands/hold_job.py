"""A single-instance command that runs until its stdin says stop (or closes)."""

import sys

from django_redis_lock import SingleInstanceCommand


class Command(SingleInstanceCommand):
    def handle(self, *args, **options):
        self.stdout.write("started")
        self.stdout.flush()
        sys.stdin.readline()
        self.stdout.write("finished")
