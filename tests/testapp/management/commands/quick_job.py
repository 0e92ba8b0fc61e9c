"""A single-instance command with a fixed lock name, that records its runs."""

from django_redis_lock import SingleInstanceCommand

runs = []


class Command(SingleInstanceCommand):
    lock_name = "jobs:quick"

    def add_arguments(self, parser):  # no super(): the lock options must still be there
        parser.add_argument("--tag", default="")

    def handle(self, *args, **options):
        runs.append(options["tag"])
