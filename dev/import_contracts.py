"""An import-linter contract that import-linter does not ship: no import inside a function.

A function-level import hides an arrow from the reader and from the other contracts' graph
until the function runs; in this package it was always the sign of a circle worked around. The
few places that must (``AppConfig.ready()``, turning on an optional exporter) are listed in the
contract's ``allowed`` option, as ``module:function``. Imports under ``if TYPE_CHECKING:`` at
module level are not function-level and are left to the other contracts.

Run by ``make lint`` (``lint-imports``; the contracts are in ``setup.cfg``).
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

__all__ = ["NoFunctionLevelImportsContract"]


def _source_files(package: str) -> dict[str, pathlib.Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package!r} is not a package that can be found on sys.path")
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def function_level_imports(module: str, path: pathlib.Path) -> list[tuple[str, int, str]]:
    """``(module:function, line, statement)`` for each import inside a function of the file."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    lines = path.read_text("utf-8").splitlines()
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name if function is None else function)
            elif isinstance(child, ast.Import | ast.ImportFrom) and function is not None:
                found.append((f"{module}:{function}", child.lineno, lines[child.lineno - 1]))
            else:
                visit(child, function)

    visit(tree, None)
    return found


class NoFunctionLevelImportsContract(Contract):
    """Options: ``packages`` (checked, with every module under them) and ``allowed``
    (``module:function`` entries whose imports are allowed)."""

    type_name = "no_function_level_imports"

    packages = fields.ListField(subfield=fields.StringField())
    allowed = fields.ListField(subfield=fields.StringField(), required=False)

    def check(self, graph, verbose: bool) -> ContractCheck:  # type: ignore[no-untyped-def]
        allowed = set(self.allowed or [])  # type: ignore[arg-type]
        unused = set(allowed)
        offending = []
        for package in self.packages:  # type: ignore[attr-defined]
            for module, path in _source_files(package).items():
                for where, line, statement in function_level_imports(module, path):
                    if where in allowed:
                        unused.discard(where)
                    else:
                        offending.append((where, line, statement.strip()))
        return ContractCheck(
            kept=not offending and not unused,
            metadata={"offending": offending, "unused": sorted(unused)},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for where, line, statement in check.metadata["offending"]:
            output.print_error(f"{where} (line {line}) imports inside a function: {statement}")
        for where in check.metadata["unused"]:
            output.print_error(
                f"{where} is allowed to import inside a function but no longer does"
            )
