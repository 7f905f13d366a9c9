"""Waiting for something to be seen, instead of sleeping for a guessed while.

The one wait helper of the test suite and of the labs in bench/ (here because bench/ never imports
tests/). A fixed `time.sleep(N)` stays only where time itself must pass, e.g. to show that
something does NOT happen within N seconds; such sleeps say so in a comment.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

SHOWN = 2000  # characters of the last value that a timeout's message shows: its start and its end


class WaitTimeout(AssertionError):
    """What was awaited did not happen in time; `last` is the last value seen."""

    def __init__(self, message: str, last: object) -> None:
        super().__init__(message)
        self.last = last


def wait_until(
    check: Callable[[], T],
    timeout: float,
    what: str,
    *,
    until: Callable[[T], object] = bool,
    interval: float = 0.05,
) -> T:
    """Call `check` every `interval` seconds until `until` holds for what it returned (by default:
    until that is true), and return that value.

    After `timeout` seconds raises WaitTimeout, an AssertionError whose message names `what` and
    the last value. `check` runs at least once, and its own time counts. What `check` raises goes
    through: a check may fail at once when waiting longer is pointless (a process died).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if until(value):
            return value
        if time.monotonic() >= deadline:
            shown = repr(value)
            if len(shown) > SHOWN:
                shown = f"{shown[: SHOWN // 2]} ... {shown[-SHOWN // 2 :]}"
            raise WaitTimeout(f"{what}: not within {timeout:g}s (last: {shown})", value)
        time.sleep(interval)
