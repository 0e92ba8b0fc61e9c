"""A schedule as a readable trace: one line per step (time, client, request, reply)."""

from __future__ import annotations

from typing import Any

from django_redis_lock.core.requests import Block, Command, Eval, Failover, Pipeline, Sleep

__all__ = ["Trace", "describe"]


def _short(value: Any, room: int = 60) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = repr(value)
    return text if len(text) <= room else text[: room - 3] + "..."


def _short_key(key: str) -> str:
    return key.replace("drl-sim:", "")


def describe(item: Any) -> str:
    """A request or a reply, in a few words."""
    if type(item) is Eval:
        # (Not the owner records: tokens, modes, flags and results say what happens.)
        args = " ".join(_short(arg, 24) for arg in item.args if "|" not in str(arg))
        keys = " ".join(_short_key(key) for key in item.keys[:1])
        return f"{item.script}.lua {keys} {args}"
    if type(item) is Command:
        return " ".join(_short(_short_key(str(arg)), 40) for arg in item.args[:3])
    if type(item) is Pipeline:
        return "pipeline: " + "; ".join(" ".join(str(a) for a in c[:2]) for c in item.commands)
    if type(item) is Block:
        return f"block on {_short_key(item.key)}"
    if type(item) is Sleep:
        return f"sleep {item.seconds:.3f} s"
    if type(item) is Failover:
        return "failover"
    if isinstance(item, BaseException):
        return f"error {type(item).__name__}: {item}"
    if isinstance(item, list):
        return "[" + ", ".join(_short(part, 48) for part in item) + "]"
    return _short(item)


class Trace:
    """The lines of one schedule, its time shown from ``start_us`` (the schedule's start)."""

    def __init__(self, start_us: int) -> None:
        self.start_us = start_us
        self.lines: list[str] = []

    def add(self, now_us: int, who: str, what: str, outcome: str = "") -> None:
        at = (now_us - self.start_us) / 1000
        line = f"{at:>10.3f} ms  {who:<4} {what}"
        self.lines.append(f"{line}  ->  {outcome}" if outcome else line)

    def text(self, last: int = 400) -> str:
        lines = self.lines[-last:]
        skipped = len(self.lines) - len(lines)
        head = [f"... {skipped} earlier steps"] if skipped else []
        return "trace (time from the schedule's start, client, step -> outcome):\n" + "\n".join(
            head + lines
        )
