"""django-redis-lock: distributed locks for Django on the Redis that django-redis configures.

The public API is re-exported here; import from ``django_redis_lock``, not its modules.
"""

from .backends.clients import (
    UnsupportedCache,
    aclose_async_redis_clients,
    get_async_redis_client,
    get_redis_client,
)
from .backends.quorum import QuorumUnavailable
from .exceptions import (
    CommandRefused,
    DuplicateTask,
    LockBackendError,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from .guards.decorators import lock, locked_method, semaphore
from .guards.double_submit import prevent_double_submit
from .guards.fencing import fenced_update
from .guards.identities import PersonalIdentity
from .guards.run_once import run_once
from .guards.single_instance import single_instance
from .guards.stampede import get_or_set_locked
from .guards.submissions import ALL, UNSAFE, DuplicateSubmission
from .management.base import AlreadyRunning, SingleInstanceCommand, SingleInstanceMixin
from .mixins import LockableModelMixin
from .primitives.acl import acl_rule
from .primitives.group import LockGroup, lock_many
from .primitives.lock import Claim, Lock
from .primitives.semaphore import Semaphore
from .signals import (
    lock_acquired,
    lock_contended,
    lock_force_released,
    lock_lost,
    lock_not_acquired,
    lock_released,
    run_skipped,
    task_duplicate_found,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "ALL",
    "UNSAFE",
    "AlreadyRunning",
    "Claim",
    "CommandRefused",
    "DuplicateSubmission",
    "DuplicateTask",
    "Lock",
    "LockBackendError",
    "LockError",
    "LockGroup",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockableModelMixin",
    "PersonalIdentity",
    "QuorumUnavailable",
    "Semaphore",
    "SingleInstanceCommand",
    "SingleInstanceMixin",
    "UnsupportedCache",
    "__version__",
    "acl_rule",
    "aclose_async_redis_clients",
    "fenced_update",
    "get_async_redis_client",
    "get_or_set_locked",
    "get_redis_client",
    "lock",
    "lock_acquired",
    "lock_contended",
    "lock_force_released",
    "lock_lost",
    "lock_many",
    "lock_not_acquired",
    "lock_released",
    "locked_method",
    "prevent_double_submit",
    "run_once",
    "run_skipped",
    "semaphore",
    "single_instance",
    "task_duplicate_found",
]
