"""``Lock``: an unmanaged model with no table, so that the admin can list live locks (read from
Redis, see ``admin.py``) and Django's permissions can guard them: ``view_lock`` to see the
Locks page, ``release_lock`` to force-release a lock."""

from django.db import models
from django.utils.translation import gettext_lazy as _


class Lock(models.Model):
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
