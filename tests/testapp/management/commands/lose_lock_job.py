"""Deletes its own lease, then works on: the renewal finds the lock gone."""

import time

from django_redis_lock import SingleInstanceCommand, get_redis_client
from django_redis_lock.primitives.keys import lock_keys

progress = []


class Command(SingleInstanceCommand):
    def add_arguments(self, parser):
        # How long the work lasts: an abort interrupts it (a test that waits for one gives
        # it long enough that no loaded machine's watchdog is that late).
        parser.add_argument("--work", type=float, default=2.0)

    def handle(self, *args, **options):
        get_redis_client().delete(lock_keys("lose_lock_job", "default").lease)
        progress.append("deleted")
        time.sleep(options["work"])
        progress.append("finished")
