"""Where a schedule's decisions come from: a seeded random source (``make simulate``, a seed
replayed), or Hypothesis (the suite's share), which shrinks a failing schedule to a minimal one
by shrinking the decisions it drew.

Every decision is one call: :meth:`Choices.pick` among a few options, :meth:`Choices.number` in
a range, :meth:`Choices.chance`. The simulation asks nothing else of them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from hypothesis import strategies

__all__ = ["Choices", "HypothesisChoices", "SeededChoices"]

T = TypeVar("T")


class Choices(Protocol):
    def pick(self, options: Sequence[T]) -> T: ...

    def number(self, low: int, high: int) -> int: ...

    def chance(self, percent: int) -> bool: ...

    def aside(self, percent: int, salt: int) -> bool: ...


class SeededChoices:
    """Decisions from ``random.Random(seed)``: the same seed, the same schedule."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._random = random.Random(seed)

    def pick(self, options: Sequence[T]) -> T:
        return options[self._random.randrange(len(options))]

    def number(self, low: int, high: int) -> int:
        return self._random.randint(low, high)

    def chance(self, percent: int) -> bool:
        return self._random.randrange(100) < percent

    def aside(self, percent: int, salt: int) -> bool:
        """:meth:`chance` from a stream of its own (``salt``: which draw of it): a decision
        added later leaves each schedule's other decisions where they were, so that the seeds
        at which the planted bugs are found stand."""
        return random.Random(self.seed * 1_000_003 + salt).randrange(100) < percent


class HypothesisChoices:
    """Decisions drawn from Hypothesis' ``data`` (``st.data()``): shrunk when a test fails,
    toward the first option, the low end, and no."""

    def __init__(self, data: Any) -> None:
        self._data = data

    def pick(self, options: Sequence[T]) -> T:
        if len(options) == 1:
            return options[0]
        return options[self._data.draw(strategies.integers(0, len(options) - 1))]

    def number(self, low: int, high: int) -> int:
        if low == high:
            return low
        result: int = self._data.draw(strategies.integers(low, high))
        return result

    def chance(self, percent: int) -> bool:
        if percent <= 0:
            return False
        # (Shrinks toward 0: toward no.)
        result: bool = self._data.draw(strategies.integers(0, 99)) >= 100 - percent
        return result

    def aside(self, percent: int, salt: int) -> bool:
        return self.chance(percent)
