"""django-redis-lock: distributed locks for Django on the Redis that django-redis configures.

The public API is re-exported here (``__all__``); import from ``django_redis_lock``. Besides
it, these import paths and the names given with them are public, and keep working across
minor releases (the stability policy: the documentation's "Stability" page, stability.md):

- ``django_redis_lock.signals``: the signals (also re-exported here).
- ``django_redis_lock.celery``: ``GuardedTask``, the Celery task guard (extra: celery).
- ``django_redis_lock.tasks``: ``guarded`` and ``GuardedBackend``, for Django's tasks framework
  (extra: tasks, before Django 6.0).
- ``django_redis_lock.registry``: the locks and semaphores held now, read and force-released.
- ``django_redis_lock.mixins``: ``LockableModelMixin``, ``PreventDoubleSubmitMixin``,
  ``release_after_transaction``.
- ``django_redis_lock.views``: ``duplicate_submission``, the default duplicate's answer.
- ``django_redis_lock.conf``: ``lock_settings`` and ``SETTINGS``, the settings as read.
- ``django_redis_lock.metrics.views``: ``metrics``, the Prometheus scrape view.
- ``django_redis_lock.metrics.prometheus``: ``CensusCollector`` (extra: prometheus).
- ``django_redis_lock.metrics.opentelemetry``: ``observe_census`` (extra: opentelemetry).
- ``django_redis_lock.debug_toolbar``: ``LocksPanel`` (extra: debug-toolbar).

Every other module (``core``, ``backends``, ``primitives``, ``guards``, ``task_guards``,
``admin``...) is the library's inside: its names may change in any release.
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

__version__ = "1.0.0rc1"

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
