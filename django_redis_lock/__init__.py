"""django-redis-lock: distributed locks for Django on the Redis that django-redis configures.

The public API is re-exported here; import from ``django_redis_lock``, not its modules.
"""

from .connection import get_redis_client
from .exceptions import (
    LockBackendError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "LockBackendError",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "__version__",
    "get_redis_client",
]
