"""Run in another PID namespace by test_dead_holders (``unshare --pid --fork``): hold a lock
with the default lease until killed. argv: the Redis URL, the lock's name."""

import sys
import time

from tests.support.workers import setup_django

setup_django(sys.argv[1])

from django_redis_lock import Lock  # noqa: E402

lock = Lock(sys.argv[2])
assert lock.acquire(wait=0)
print("held", flush=True)
time.sleep(3600)
