from django.apps import AppConfig
from django.core import checks
from django.utils.translation import gettext_lazy as _


class DjangoRedisLockConfig(AppConfig):
    name = "django_redis_lock"
    verbose_name = _("Redis locks")

    def ready(self) -> None:
        from .checks import check_cache, check_eviction, check_settings, check_socket_timeout

        checks.register(check_settings)
        checks.register(check_cache, checks.Tags.caches)
        checks.register(check_socket_timeout, checks.Tags.caches, deploy=True)
        checks.register(check_eviction, checks.Tags.caches, deploy=True)

        from .metrics import setup

        setup.configure()  # the exporters DJANGO_REDIS_LOCK_METRICS names (none: no cost)
