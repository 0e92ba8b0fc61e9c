"""``HeldLock``: an unmanaged model with no table, so that the admin can list the locks held now
(read from Redis, see ``admin.py``) and Django's permissions can guard them: ``view_heldlock``
to see the Locks page, ``release_lock`` to force-release a lock. (Not ``Lock``: that is the
lock itself, ``django_redis_lock.Lock``.)"""

from django.db import models
from django.utils.translation import gettext_lazy as _


class HeldLock(models.Model):
    # Only for the admin's URLs and log entries: rows never exist, locks live in Redis.
    name = models.CharField(_("name"), max_length=255, primary_key=True)

    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = [("release_lock", "Can force-release a lock")]
        verbose_name = _("lock")
        verbose_name_plural = _("locks")

    def __str__(self) -> str:
        return self.name
