"""Hides installed packages from a Python started with this folder on its ``PYTHONPATH``, as if
they were not installed: the modules ``DJANGO_REDIS_LOCK_TEST_HIDDEN`` names (comma-separated,
each with its submodules: ``django_tasks,django.tasks``) are not found, so importing one raises
``ModuleNotFoundError`` and ``importlib.util.find_spec`` gives None, as they would there.

A ``sitecustomize``, so that every process started with that ``PYTHONPATH`` hides them before
anything is imported: a ``python -c`` child, a Celery worker and its pool alike.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

HIDDEN = tuple(filter(None, os.environ.get("DJANGO_REDIS_LOCK_TEST_HIDDEN", "").split(",")))


class HidingPathFinder(PathFinder):
    """The finder of installed modules, blind to the hidden ones. It takes the place of
    ``PathFinder`` rather than going before it: a finder that returns None lets the next one
    look, and one that raises makes ``find_spec`` raise instead of answering None."""

    @classmethod
    def find_spec(cls, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if any(fullname == name or fullname.startswith(f"{name}.") for name in HIDDEN):
            return None
        return super().find_spec(fullname, path, target)


if HIDDEN:
    sys.meta_path[sys.meta_path.index(PathFinder)] = HidingPathFinder
