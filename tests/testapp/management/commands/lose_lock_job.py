"""Deletes its own lease, then works on: the renewal finds the lock gone."""

import time

from django_redis_lock import SingleInstanceCommand, get_redis_client
from django_redis_lock.primitives.keys import lock_keys

progress = []


class Command(SingleInstanceCommand):
    def handle(self, *args, **options):
        get_redis_client().delete(lock_keys("lose_lock_job", "default").lease)
        progress.append("deleted")
        time.sleep(2)  # the work; an abort interrupts it
        progress.append("finished")
