"""Deliberate bugs, to show that the simulation finds each: a script's source with one rule
taken out. ``MUTATIONS[name]`` is ``(script, the text to replace, what replaces it, the
workload that should notice)``; :func:`patch_for` makes the ``patch`` that
``server.simulated_scripts`` applies.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MUTATIONS", "patch_for"]

MUTATIONS: dict[str, tuple[str, str, str, str]] = {
    # The double run of issue 27: a waiter that finds the lease handed to it is not told that
    # the guarded work is done (only the wake-up message, which may come late, said so).
    "join forgets the result": (
        "join",
        "if wants_result(flags) and done(flags, redis.call('GET', KEYS[5]), token) then "
        "finished = '1' end",
        "",
        "want_result",
    ),
    # A release that does not check whose lease it ends.
    "release ignores the token": (
        "release",
        "if string.sub(value, 1, #token + 1) ~= token .. '|' then",
        "if false then",
        "lock",
    ),
    # A renewal that lengthens whichever lease is there.
    "extend ignores the token": (
        "extend",
        "string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|'",
        "false",
        "lock",
    ),
    # A queue join that does not say when it queued: a wake-up pushed late, after the lease it
    # handed had ended, is taken for a grant again (found by a campaign, fixed since).
    "join forgets when it queued": (
        "join",
        "joined = string.format('%.0f', micros)",
        "joined = false",
        "lock",
    ),
    # fair=False without its bound: a waiter is left to compete for a free lock for ever.
    "unfair release never serves the starved": (
        "release",
        "if now - since >= bound then break end",
        "",
        "lock",
    ),
    # A semaphore that counts one permit too many.
    "semaphore miscounts": (
        "permit_acquire",
        "local free = limit - redis.call('ZCARD', KEYS[1])",
        "local free = limit + 1 - redis.call('ZCARD', KEYS[1])",
        "semaphore",
    ),
}


def patch_for(mutation: str) -> Callable[[str, str], str]:
    script, old, new, _ = MUTATIONS[mutation]

    def patch(name: str, source: str) -> str:
        if name != script:
            return source
        if old not in source:
            raise AssertionError(f"mutation {mutation!r}: {old!r} is no longer in {name}.lua")
        return source.replace(old, new, 1)

    return patch
