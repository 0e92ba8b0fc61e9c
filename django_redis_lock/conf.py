"""Every django-redis-lock setting, its default and its validation, in one place.

Settings are flat Django settings named ``DJANGO_REDIS_LOCK_<NAME>``. They are read from
``django.conf.settings`` when first needed, validated, and kept until Django's
``setting_changed`` signal says they changed, so ``override_settings`` and the pytest-django
``settings`` fixture work without extra plumbing. No other module of the package
reads ``django.conf.settings`` for these names: use ``lock_settings.<NAME>``.

A bad value raises :class:`InvalidSetting` (an ``ImproperlyConfigured``) when it is read, and
the system checks in ``checks.py`` report the same problem, with the same words, at start-up.
``docs/settings.md`` documents each setting; keep it in step with ``SETTINGS`` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import validators
from .validators import InvalidSetting

__all__ = ["PREFIX", "SETTINGS", "InvalidSetting", "LockSettings", "lock_settings"]

PREFIX = "DJANGO_REDIS_LOCK_"


@dataclass(frozen=True)
class Setting:
    """One setting: its name without the prefix, its default, and how to validate it."""

    name: str
    default: Any
    validate: Callable[[str, Any], Any]
    doc: str

    @property
    def full_name(self) -> str:
        return PREFIX + self.name


SETTINGS: dict[str, Setting] = {
    setting.name: setting
    for setting in (
        Setting(
            "CACHE_ALIAS",
            "default",
            validators.string(),
            "The Django cache alias whose Redis connection the locks use.",
        ),
        Setting(
            "KEY_PREFIX",
            "lock",
            validators.string(forbidden="{}"),
            "Namespace of our keys, after the cache's own KEY_PREFIX.",
        ),
        Setting(
            "TIMEOUT",
            30,
            validators.seconds(wait=False),
            "Default lease in seconds, renewed automatically while held when AUTO_RENEW.",
        ),
        Setting(
            "WAIT",
            10,
            validators.seconds(wait=True),
            "Default longest wait for a held lock, in seconds; 0 means do not wait.",
        ),
        Setting(
            "AUTO_RENEW",
            True,
            validators.boolean,
            "Renew default-length leases in the background while the lock is held.",
        ),
        Setting(
            "DEAD_HOLDERS",
            True,
            validators.boolean,
            "End at once the lease of a holder that died on this machine (same boot and PID "
            "namespace), instead of waiting for it to run out.",
        ),
        Setting(
            "FAIL_OPEN",
            False,
            validators.boolean,
            "When Redis is unreachable, let guarded views and commands run unprotected.",
        ),
        Setting(
            "ENABLED",
            True,
            validators.boolean,
            "False turns the Django guards (decorators, mixins, commands) into no-ops.",
        ),
        Setting(
            "COMMAND_EXIT_CODE",
            75,
            validators.integer(minimum=0, maximum=255, kind="an exit status (an int)"),
            "Exit status of a single-instance command that finds another instance running.",
        ),
        Setting(
            "COMMAND_ON_LOST",
            "abort",
            validators.choice("abort", "finish"),
            "A single-instance command whose lock is lost: stop it, or let it finish.",
        ),
        Setting(
            "DUPLICATE_SUBMISSION_VIEW",
            None,
            validators.optional_callable,
            "Dotted path to a view(request, exception) answering duplicate submissions.",
        ),
        Setting(
            "REPLAY_MAX_BYTES",
            65536,
            validators.integer(minimum=0, kind="a number of bytes (an int)"),
            "Largest response body kept to replay to duplicate submissions.",
        ),
        Setting(
            "REPLAY_CLIENT_MAX_BYTES",
            1048576,
            validators.integer(minimum=0, kind="a number of bytes (an int)"),
            "Most bytes of responses kept for replay per client, per window of their keep time.",
        ),
        Setting(
            "REPLAY_TOTAL_MAX_BYTES",
            67108864,
            validators.integer(minimum=0, kind="a number of bytes (an int)"),
            "Most bytes of responses kept for replay in all, per window of their keep time.",
        ),
        Setting(
            "SHOW_ADMIN",
            True,
            validators.boolean,
            "Show the Locks page in the Django admin.",
        ),
        Setting(
            "ADMIN_PAGE_SIZE",
            100,
            validators.integer(minimum=1),
            "Locks per page on the admin Locks page (also the SCAN batch size).",
        ),
        Setting(
            "MIN_REPLICAS",
            0,
            validators.integer(minimum=0),
            "Replicas that must confirm an acquisition (WAIT) before it counts; 0: none.",
        ),
        Setting(
            "REPLICA_TIMEOUT",
            0.5,
            validators.seconds(wait=False),
            "Longest wait, in seconds, for MIN_REPLICAS to confirm an acquisition.",
        ),
        Setting(
            "QUORUMS",
            {},
            validators.quorums,
            "Named quorums: {name: [cache aliases of independent servers]}, usable as aliases.",
        ),
        Setting(
            "TASK_QUEUED_TIMEOUT",
            3600,
            validators.seconds(wait=False),
            "Longest a task guard keeps a key for a task that waits in its queue, in seconds.",
        ),
        Setting(
            "TASK_DONE_TTL",
            3600,
            validators.seconds(wait=False),
            "How long a finished guarded task's id is kept against its redelivered copies.",
        ),
        Setting(
            "METRICS",
            [],
            validators.exporters,
            "Exporters of the locks' metrics: 'prometheus', 'opentelemetry' (none by default).",
        ),
        Setting(
            "METRICS_TOKEN",
            None,
            validators.optional_secret,
            "A bearer token that lets a scraper read the metrics view without logging in.",
        ),
        Setting(
            "CONNECTION_FACTORY",
            None,
            validators.optional_callable,
            "Dotted path to a callable(alias) returning a redis-py client, e.g. for Cluster.",
        ),
    )
}


class LockSettings:
    """Typed, validated, always-current view of the ``DJANGO_REDIS_LOCK_*`` settings."""

    def raw(self, name: str) -> Any:
        """The value as configured (or the default), without validation."""
        return getattr(settings, SETTINGS[name].full_name, SETTINGS[name].default)

    def __init__(self) -> None:
        # Validated values, dropped when Django says a setting changed (override_settings,
        # the pytest-django `settings` fixture): reading an unset setting through
        # django.conf.settings raises and catches AttributeError, every time, on hot paths.
        self._validated: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        """The validated value; raises :class:`InvalidSetting` on a bad one."""
        try:
            return self._validated[name]
        except KeyError:
            pass
        setting = SETTINGS[name]
        value = setting.validate(setting.full_name, self.raw(name))
        self._validated[name] = value
        return value

    def forget(self, setting: str | None = None) -> None:
        """Drop the cached value of ``setting`` (a full name), or of every setting."""
        if setting is None:
            self._validated.clear()
        elif setting.startswith(PREFIX):
            self._validated.pop(setting.removeprefix(PREFIX), None)

    @property
    def CACHE_ALIAS(self) -> str:
        return cast("str", self.get("CACHE_ALIAS"))

    @property
    def KEY_PREFIX(self) -> str:
        return cast("str", self.get("KEY_PREFIX"))

    @property
    def TIMEOUT(self) -> float:
        return cast("float", self.get("TIMEOUT"))

    @property
    def WAIT(self) -> float:
        return cast("float", self.get("WAIT"))

    @property
    def AUTO_RENEW(self) -> bool:
        return cast("bool", self.get("AUTO_RENEW"))

    @property
    def DEAD_HOLDERS(self) -> bool:
        return cast("bool", self.get("DEAD_HOLDERS"))

    @property
    def FAIL_OPEN(self) -> bool:
        return cast("bool", self.get("FAIL_OPEN"))

    @property
    def ENABLED(self) -> bool:
        return cast("bool", self.get("ENABLED"))

    @property
    def COMMAND_EXIT_CODE(self) -> int:
        return cast("int", self.get("COMMAND_EXIT_CODE"))

    @property
    def COMMAND_ON_LOST(self) -> str:
        return cast("str", self.get("COMMAND_ON_LOST"))

    @property
    def DUPLICATE_SUBMISSION_VIEW(self) -> Callable[..., Any] | None:
        return cast("Callable[..., Any] | None", self.get("DUPLICATE_SUBMISSION_VIEW"))

    @property
    def REPLAY_MAX_BYTES(self) -> int:
        return cast("int", self.get("REPLAY_MAX_BYTES"))

    @property
    def REPLAY_CLIENT_MAX_BYTES(self) -> int:
        return cast("int", self.get("REPLAY_CLIENT_MAX_BYTES"))

    @property
    def REPLAY_TOTAL_MAX_BYTES(self) -> int:
        return cast("int", self.get("REPLAY_TOTAL_MAX_BYTES"))

    @property
    def SHOW_ADMIN(self) -> bool:
        return cast("bool", self.get("SHOW_ADMIN"))

    @property
    def ADMIN_PAGE_SIZE(self) -> int:
        return cast("int", self.get("ADMIN_PAGE_SIZE"))

    @property
    def MIN_REPLICAS(self) -> int:
        return cast("int", self.get("MIN_REPLICAS"))

    @property
    def REPLICA_TIMEOUT(self) -> float:
        return cast("float", self.get("REPLICA_TIMEOUT"))

    @property
    def QUORUMS(self) -> dict[str, tuple[str, ...]]:
        return cast("dict[str, tuple[str, ...]]", self.get("QUORUMS"))

    @property
    def TASK_QUEUED_TIMEOUT(self) -> float:
        return cast("float", self.get("TASK_QUEUED_TIMEOUT"))

    @property
    def TASK_DONE_TTL(self) -> float:
        return cast("float", self.get("TASK_DONE_TTL"))

    @property
    def METRICS(self) -> tuple[str, ...]:
        return cast("tuple[str, ...]", self.get("METRICS"))

    @property
    def METRICS_TOKEN(self) -> str | None:
        return cast("str | None", self.get("METRICS_TOKEN"))

    @property
    def CONNECTION_FACTORY(self) -> Callable[[str], Any] | None:
        return cast("Callable[[str], Any] | None", self.get("CONNECTION_FACTORY"))


lock_settings = LockSettings()


@receiver(setting_changed)
def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    lock_settings.forget(setting)
