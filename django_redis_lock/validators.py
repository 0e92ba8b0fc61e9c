"""The validators of django-redis-lock's settings (``conf.py`` reads the settings).

Each takes the full setting name and the raw value, and returns the value to use, or raises
:class:`InvalidSetting`.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .core import durations

__all__ = [
    "MIN_MEMBERS",
    "InvalidSetting",
    "boolean",
    "checked_quorum",
    "choice",
    "integer",
    "optional_callable",
    "optional_secret",
    "quorums",
    "seconds",
    "string",
]


# The system check that reports each kind of problem (checks.py), named in errors too.
_CHECK_IDS = {
    "type": "django_redis_lock.E004",
    "value": "django_redis_lock.E005",
    "import": "django_redis_lock.E006",
    "missing": "django_redis_lock.E008",
}


class InvalidSetting(ImproperlyConfigured):
    """A ``DJANGO_REDIS_LOCK_*`` setting has a value we cannot use.

    ``problem`` is ``"type"``, ``"value"``, ``"import"`` or ``"missing"`` (an extra not
    installed); ``check_id`` the system check that reports it.
    """

    def __init__(self, setting: str, message: str, *, problem: str, hint: str = "") -> None:
        self.setting = setting
        self.problem = problem
        self.check_id = _CHECK_IDS[problem]
        self.hint = hint
        super().__init__(f"{setting} {message}" + (f" {hint}" if hint else ""))
        self.message = f"{setting} {message}"


def string(*, forbidden: str = "") -> Callable[[str, Any], str]:
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


def seconds(*, wait: bool) -> Callable[[str, Any], float]:
    def validate(setting: str, value: Any) -> float:
        # The same rule, and words, as a Lock's own arguments (core/durations.py).
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


def boolean(setting: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidSetting(setting, f"must be True or False, not {value!r}.", problem="type")
    return value


def choice(*choices: str) -> Callable[[str, Any], str]:
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


def integer(
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


# With two servers a majority is both: no server could fail, which is worse than one server.
MIN_MEMBERS = 3


def checked_quorum(value: Any) -> tuple[str, ...]:
    """The cache aliases of a quorum, checked (``TypeError`` / ``ValueError``)."""
    if not isinstance(value, list | tuple):
        raise TypeError(f"A quorum is a list of cache aliases, not {type(value).__name__}.")
    for alias in value:
        if not isinstance(alias, str) or not alias:
            raise TypeError(f"A quorum's members are cache aliases (non-empty str), not {alias!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"A quorum names each cache alias once, not {list(value)!r}.")
    if len(value) < MIN_MEMBERS:
        raise ValueError(
            f"A quorum needs at least {MIN_MEMBERS} cache aliases on independent Redis servers, "
            f"not {len(value)}: with 2, a majority is both, so neither server may fail."
        )
    return tuple(value)


def quorums(setting: str, value: Any) -> dict[str, tuple[str, ...]]:
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
            quorums[name] = checked_quorum(aliases)  # the rule of Lock(using=[...])
        except TypeError as exc:
            raise InvalidSetting(setting, f"[{name!r}]: {exc}", problem="type") from None
        except ValueError as exc:
            raise InvalidSetting(setting, f"[{name!r}]: {exc}", problem="value") from None
    return quorums


EXPORTERS = {"prometheus": "prometheus_client", "opentelemetry": "opentelemetry.metrics"}


def exporters(setting: str, value: Any) -> tuple[str, ...]:
    """Metrics exporters: names from ``EXPORTERS``, each with its package installed."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidSetting(
            setting, f"must be a list of exporter names, not {value!r}.", problem="type",
            hint=f"For example [{', '.join(map(repr, EXPORTERS))}].",
        )  # fmt: skip
    for name in value:
        if name not in EXPORTERS:
            raise InvalidSetting(
                setting,
                f"names an unknown exporter {name!r}: use {' or '.join(map(repr, EXPORTERS))}.",
                problem="value",
            )
        if importlib.util.find_spec(EXPORTERS[name].split(".")[0]) is None:
            raise InvalidSetting(
                setting, f"names {name!r}, whose package is not installed.", problem="missing",
                hint=f'pip install "django-redis-lock[{name}]"',
            )  # fmt: skip
    return tuple(dict.fromkeys(value))


def optional_secret(setting: str, value: Any) -> str | None:
    """A shared secret (a bearer token), or None: long enough not to be guessed."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidSetting(
            setting, f"must be a string (or None), not {type(value).__name__}.", problem="type"
        )
    if len(value) < 16 or any(char.isspace() for char in value):
        raise InvalidSetting(
            setting,
            "must be at least 16 characters, without spaces.",
            problem="value",
            hint="For example: python -c 'import secrets; print(secrets.token_urlsafe())'",
        )
    return value


def optional_callable(setting: str, value: Any) -> Callable[..., Any] | None:
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
