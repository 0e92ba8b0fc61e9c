"""The results files' pieces: numbers, Markdown tables, a row that says n/a, the heading."""

from __future__ import annotations

from collections.abc import Sequence


def fmt(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [md_row(header), md_row(["---"] * len(header)), *(md_row(row) for row in rows)]


def na_row(title: str, reason: str, width: int) -> list[str]:
    return [title, f"n/a: {reason}", *([""] * (width - 2))]


def heading(title: str, script: str, seconds: float, machine: dict[str, str]) -> list[str]:
    """The top of a results file: its title, what wrote it, and the machine."""
    lines = [
        f"# django-redis-lock benchmark results{title}",
        "",
        f"Written by `benchmarks/{script}` (`make bench`) in {seconds:.0f} s. "
        "What each number means: `benchmarks/README.md`.",
        "",
        "## Machine",
        "",
    ]
    return lines + [f"- **{key}**: {value}" for key, value in machine.items()]
