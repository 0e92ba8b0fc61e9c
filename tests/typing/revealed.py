"""Checked by mypy in tests/package/test_types.py: each ``reveal_type`` line ends with the
type mypy must reveal, after ``# ->``. Never run."""
# ruff: noqa: F821 - reveal_type is mypy's, not a name to import

from django_redis_lock import (
    Lock,
    get_or_set_locked,
    lock,
    prevent_double_submit,
    run_once,
    single_instance,
)


@run_once("job:{n}", ttl=60)
def job(n: int) -> str:
    return str(n)


@run_once("ajob", ttl=60)
async def ajob() -> int:
    return 1


@lock("import:{feed}")
def run_import(feed: int) -> bool:
    return True


def report() -> list[int]:
    return [1]


async def main() -> None:
    reveal_type(await ajob())  # -> int | None


@single_instance("sync:{n}")
def sync(n: int) -> float:
    return 1.0


held = Lock("x")
reveal_type(job(1))  # -> str | None
reveal_type(run_import(1))  # -> bool
reveal_type(get_or_set_locked("k", report))  # -> list[int]
reveal_type(held.acquire())  # -> bool
reveal_type(sync(1))  # -> float | None
reveal_type(held.fencing_token)  # -> int | None
reveal_type(prevent_double_submit())  # -> def [F <: def (*Any, **Any) -> Any] (F) -> F
