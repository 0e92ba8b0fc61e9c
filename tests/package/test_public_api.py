"""What is public, written down (as httpx's ``test_exported_members``): ``__all__`` is exactly
what the package's top level offers, each of it is in the API reference, and the public module
paths its docstring lists import and give the names it says."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import django_redis_lock
from django_redis_lock import signals

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
# Documented on a guide's page rather than the reference: (name, page that names it).
ON_THEIR_PAGE = {"ALL": "views.md", "UNSAFE": "views.md", "__version__": None}


def test_all_is_exactly_what_the_top_level_offers():
    offered = {
        name
        for name, value in vars(django_redis_lock).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert offered == set(django_redis_lock.__all__) - {"__version__"}
    assert len(django_redis_lock.__all__) == len(set(django_redis_lock.__all__))


def test_every_exported_name_is_documented():
    documented = set(re.findall(r"^::: django_redis_lock\.(\w+)$", REFERENCE, re.MULTILINE))
    assert "signals" in documented  # (the module, with every signal)
    documented |= set(signals.__all__)
    undocumented = []
    for name in django_redis_lock.__all__:
        if name in documented:
            continue
        page = ON_THEIR_PAGE.get(name, "missing")
        if page == "missing" or (
            page is not None
            and f"`{name}`" not in (ROOT / "docs" / page).read_text(encoding="utf-8")
        ):
            undocumented.append(name)
    assert undocumented == []
    # And nothing documented at the top level that is not exported.
    assert documented - {"signals"} <= set(django_redis_lock.__all__)


def public_paths() -> dict[str, list[str]]:
    """The docstring's list: module path -> the names given with it."""
    paths = {}
    for path, said in re.findall(
        r"^- ``(django_redis_lock\.[\w.]+)``: (.*?)(?=^- |^\n|\Z)",
        django_redis_lock.__doc__,
        re.MULTILINE | re.DOTALL,
    ):
        paths[path] = re.findall(r"``(\w+)``", said)
    return paths


def test_the_public_module_paths_import_and_give_what_the_docstring_says():
    paths = public_paths()
    assert len(paths) >= 10, paths
    for path, names in paths.items():
        module = importlib.import_module(path)
        missing = [n for n in names if n not in getattr(module, "__all__", ())]
        assert missing == [], f"{path} does not export {missing}"


def test_the_reference_documents_only_public_paths():
    paths = set(public_paths()) | {"django_redis_lock"}
    for target in re.findall(r"^::: ([\w.]+)$", REFERENCE, re.MULTILINE):
        module = target.rsplit(".", 1)[0] if target.count(".") > 1 else target
        if target.count(".") == 1:  # (django_redis_lock.Name, or .signals)
            continue
        assert module in paths, f"the reference documents {target}, whose module is not public"
