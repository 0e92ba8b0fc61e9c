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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from . import durations

__all__ = ["PREFIX", "SETTINGS", "InvalidSetting", "LockSettings", "lock_settings"]

PREFIX = "DJANGO_REDIS_LOCK_"


class InvalidSetting(ImproperlyConfigured):
    """A ``DJANGO_REDIS_LOCK_*`` setting has a value we cannot use.

    ``problem`` is ``"type"``, ``"value"`` or ``"import"``: the system checks map it to an id.
    """

    def __init__(self, setting: str, message: str, *, problem: str, hint: str = "") -> None:
        self.setting = setting
        self.problem = problem
        self.hint = hint
        super().__init__(f"{setting} {message}" + (f" {hint}" if hint else ""))
        self.message = f"{setting} {message}"


# Validators take the full setting name and the raw value, and return the value to use.


def _string(*, forbidden: str = "") -> Callable[[str, Any], str]:
    def validate(setting: str, value: Any) -> str:
        if not isinstance(value, str):
            raise InvalidSetting(
                setting, f"must be a string, not {type(value).__name__}.", problem="type"
            )
        if not value:
            raise InvalidSetting(setting, "must not be empty.", problem="value")
        bad = sorted({char for char in value if char in forbidden or char.isspace()})
        if bad:
            raise InvalidSetting(
                setting,
                f"must not contain {', '.join(map(repr, bad))} (got {value!r}).",
                problem="value",
                # Braces would break the {hash tag} that keeps one lock's keys in one
                # Redis Cluster slot; whitespace makes keys hard to read and to quote.
                hint="Use letters, digits, '-', '_', ':' or '.'.",
            )
        return value

    return validate


def _seconds(*, wait: bool) -> Callable[[str, Any], float]:
    def validate(setting: str, value: Any) -> float:
        # The same rule, and words, as a Lock's own arguments (durations.py).
        error: Exception
        try:
            return durations.seconds(value, setting, wait=wait)
        except TypeError as exc:
            problem, error = "type", exc
        except ValueError as exc:
            problem, error = "value", exc
        raise InvalidSetting(
            setting,
            str(error).removeprefix(f"{setting} "),
            problem=problem,
            hint="Every lease and every default wait is finite, so nothing hangs forever."
            if problem == "value" and value == math.inf
            else "",
        )

    return validate


def _boolean(setting: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidSetting(setting, f"must be True or False, not {value!r}.", problem="type")
    return value


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def validate(setting: str, value: Any) -> str:
        if not isinstance(value, str):
            raise InvalidSetting(
                setting, f"must be a string, not {type(value).__name__}.", problem="type"
            )
        if value not in choices:
            raise InvalidSetting(
                setting,
                f"must be one of {', '.join(map(repr, choices))}, not {value!r}.",
                problem="value",
            )
        return value

    return validate


def _integer(
    *, minimum: int, maximum: int | None = None, kind: str = "an int"
) -> Callable[[str, Any], int]:
    def validate(setting: str, value: Any) -> int:
        # bool is an int subclass: True is a mistake here, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSetting(
                setting, f"must be {kind}, not {type(value).__name__}.", problem="type"
            )
        if value < minimum or (maximum is not None and value > maximum):
            bound = (
                f"between {minimum} and {maximum}" if maximum is not None else f"{minimum} or more"
            )
            raise InvalidSetting(setting, f"must be {bound}, not {value}.", problem="value")
        return value

    return validate


def _quorums(setting: str, value: Any) -> dict[str, tuple[str, ...]]:
    from .quorum import members  # the same rule as Lock(using=[...])

    if not isinstance(value, dict):
        raise InvalidSetting(
            setting,
            f"must be a dict of quorum name to list of cache aliases, not {type(value).__name__}.",
            problem="type",
        )
    quorums = {}
    for name, aliases in value.items():
        if not isinstance(name, str) or not name:
            raise InvalidSetting(
                setting, f"keys must be quorum names (non-empty str), not {name!r}.",
                problem="type",
            )  # fmt: skip
        try:
            quorums[name] = members(aliases)
        except TypeError as exc:
            raise InvalidSetting(setting, f"[{name!r}]: {exc}", problem="type") from None
        except ValueError as exc:
            raise InvalidSetting(setting, f"[{name!r}]: {exc}", problem="value") from None
    return quorums


def _optional_callable(setting: str, value: Any) -> Callable[..., Any] | None:
    if value is None or callable(value):
        return cast("Callable[..., Any] | None", value)
    if not isinstance(value, str):
        raise InvalidSetting(
            setting,
            f"must be a dotted path to a callable (or None), not {type(value).__name__}.",
            problem="type",
        )
    try:
        target = import_string(value)
    except ImportError as exc:
        raise InvalidSetting(setting, f"cannot be imported: {exc}", problem="import") from exc
    if not callable(target):
        raise InvalidSetting(setting, f"names {value!r}, which is not callable.", problem="import")
    return cast("Callable[..., Any]", target)


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
            _string(),
            "The Django cache alias whose Redis connection the locks use.",
        ),
        Setting(
            "KEY_PREFIX",
            "lock",
            _string(forbidden="{}"),
            "Namespace of our keys, after the cache's own KEY_PREFIX.",
        ),
        Setting(
            "TIMEOUT",
            30,
            _seconds(wait=False),
            "Default lease in seconds, renewed automatically while held when AUTO_RENEW.",
        ),
        Setting(
            "WAIT",
            10,
            _seconds(wait=True),
            "Default longest wait for a held lock, in seconds; 0 means do not wait.",
        ),
        Setting(
            "AUTO_RENEW",
            True,
            _boolean,
            "Renew default-length leases in the background while the lock is held.",
        ),
        Setting(
            "FAIL_OPEN",
            False,
            _boolean,
            "When Redis is unreachable, let guarded views and commands run unprotected.",
        ),
        Setting(
            "ENABLED",
            True,
            _boolean,
            "False turns the Django guards (decorators, mixins, commands) into no-ops.",
        ),
        Setting(
            "COMMAND_EXIT_CODE",
            75,
            _integer(minimum=0, maximum=255, kind="an exit status (an int)"),
            "Exit status of a single-instance command that finds another instance running.",
        ),
        Setting(
            "COMMAND_ON_LOST",
            "abort",
            _choice("abort", "finish"),
            "A single-instance command whose lock is lost: stop it, or let it finish.",
        ),
        Setting(
            "DUPLICATE_SUBMISSION_VIEW",
            None,
            _optional_callable,
            "Dotted path to a view(request, exception) answering duplicate submissions.",
        ),
        Setting(
            "REPLAY_MAX_BYTES",
            65536,
            _integer(minimum=0, kind="a number of bytes (an int)"),
            "Largest response body kept to replay to duplicate submissions.",
        ),
        Setting(
            "REPLAY_CLIENT_MAX_BYTES",
            1048576,
            _integer(minimum=0, kind="a number of bytes (an int)"),
            "Most bytes of responses kept for replay per client, per window of their keep time.",
        ),
        Setting(
            "REPLAY_TOTAL_MAX_BYTES",
            67108864,
            _integer(minimum=0, kind="a number of bytes (an int)"),
            "Most bytes of responses kept for replay in all, per window of their keep time.",
        ),
        Setting(
            "SHOW_ADMIN",
            True,
            _boolean,
            "Show the Locks page in the Django admin.",
        ),
        Setting(
            "ADMIN_PAGE_SIZE",
            100,
            _integer(minimum=1),
            "Locks per page on the admin Locks page (also the SCAN batch size).",
        ),
        Setting(
            "MIN_REPLICAS",
            0,
            _integer(minimum=0),
            "Replicas that must confirm an acquisition (WAIT) before it counts; 0: none.",
        ),
        Setting(
            "REPLICA_TIMEOUT",
            0.5,
            _seconds(wait=False),
            "Longest wait, in seconds, for MIN_REPLICAS to confirm an acquisition.",
        ),
        Setting(
            "QUORUMS",
            {},
            _quorums,
            "Named quorums: {name: [cache aliases of independent servers]}, usable as aliases.",
        ),
        Setting(
            "CONNECTION_FACTORY",
            None,
            _optional_callable,
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
    def CONNECTION_FACTORY(self) -> Callable[[str], Any] | None:
        return cast("Callable[[str], Any] | None", self.get("CONNECTION_FACTORY"))


lock_settings = LockSettings()


@receiver(setting_changed)
def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    lock_settings.forget(setting)
