"""The ACL rule for a Redis user of the locks alone, from the settings: the keys of the locks'
namespace on ``using`` and the commands the locks send there (``backends/acl.py``)."""

from __future__ import annotations

from ..backends.acl import acl_rule as rule_for
from ..backends.choice import backend_of
from ..conf import lock_settings
from .keys import namespace

__all__ = ["acl_rule"]


def acl_rule(using: str | None = None) -> str:
    """What follows ``ACL SETUSER <user> on ><password>`` for a user of the locks alone on the
    alias (or quorum) ``using`` (default ``DJANGO_REDIS_LOCK_CACHE_ALIAS``): read-write access
    to the locks' keys and nothing else, and only the commands they send.

    Give that user an alias of its own (the cache's own keys are not in the rule), and point
    ``DJANGO_REDIS_LOCK_CACHE_ALIAS`` at it. ``manage.py redis_locks acl`` prints the command.
    """
    alias = using or lock_settings.CACHE_ALIAS
    return rule_for([namespace(alias)], backend_of(alias).client_commands)
