"""The time a run's loops see, injected, and the one token that cancels them.

Loops wait through `Clock.wait(cancel, seconds)`: the real clock waits on the token, so a cancel
is noticed at once; the fake clock moves its time forward by the wait, so a test replays hours of
a run in milliseconds, with no `sleep`.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Cancel:
    """Set once to end every loop that holds it: a `down`, a SIGTERM, a Ctrl-C, the end of an
    attached `up`. `reason` says which, for whoever ends the run afterwards."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "") -> None:
        if not self._event.is_set():
            self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float | None = None) -> bool:
        """Until set or `seconds` passed (real time); True once set."""
        return self._event.wait(seconds)


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for durations and deadlines."""
        ...

    def time(self) -> float:
        """Epoch seconds, for what is shown or stored."""
        ...

    def wait(self, cancel: Cancel, seconds: float) -> bool:
        """Let `seconds` pass unless cancelled first; True once cancelled."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let `seconds` pass (a pause nothing cancels)."""
        ...


class RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, cancel: Cancel, seconds: float) -> bool:
        return cancel.wait(max(0.0, seconds))

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to (`advance`) or waited on: tests drive it by hand, or
    let each wait of a loop pass at once (a run on in-process hosts, whose tasks live by looks)."""

    def __init__(self, start: float = 1000.0, epoch: float = 1_700_000_000.0) -> None:
        self._now = start
        self._offset = epoch - start
        self._lock = threading.Lock()  # (several threads may read it while one loop waits on it)

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += max(0.0, seconds)

    def wait(self, cancel: Cancel, seconds: float) -> bool:
        if not cancel.is_set():
            self.advance(seconds)
        return cancel.is_set()

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


REAL_CLOCK = RealClock()
