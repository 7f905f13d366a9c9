"""wait_until (bench/waiting.py), the one wait helper of the test suite and the labs."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from bench.waiting import SHOWN, WaitTimeout, wait_until


def test_the_first_true_value_is_returned() -> None:
    values: Iterator[object] = iter([0, None, "", [], 3, 4])
    assert wait_until(lambda: next(values), 5, "a value", interval=0) == 3


def test_until_judges_each_value_and_the_one_it_accepts_is_returned() -> None:
    values = iter([{"state": "running"}, {"state": "running"}, {"state": "failed"}, {"state": "gone"}])
    got = wait_until(lambda: next(values), 5, "the end", until=lambda v: v["state"] != "running", interval=0)
    assert got == {"state": "failed"}


def test_a_timeout_is_an_assertion_naming_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"^the moon: not within 0\.2s \(last: 'not yet'\)$") as failed:
        wait_until(lambda: "not yet", 0.2, "the moon", until=lambda v: v == "now", interval=0.05)
    assert isinstance(failed.value, WaitTimeout) and failed.value.last == "not yet"


def test_it_checks_every_interval_until_the_deadline_has_passed() -> None:
    calls: list[float] = []
    began = time.monotonic()
    with pytest.raises(WaitTimeout):
        wait_until(lambda: calls.append(time.monotonic()), 0.5, "never", interval=0.1)
    assert calls[-1] - began >= 0.5  # the last check is at or after the deadline
    assert 2 <= len(calls) <= 7  # never more often than every 0.1 s


def test_what_the_check_raises_goes_through_at_once() -> None:
    began = time.monotonic()

    def dead() -> bool:
        raise RuntimeError("the daemon exited")

    with pytest.raises(RuntimeError, match="the daemon exited"):
        wait_until(dead, 10, "the daemon")
    assert time.monotonic() - began < 5


def test_a_long_last_value_shows_its_start_and_its_end() -> None:
    output = "start " + "x" * 10 * SHOWN + " end"
    with pytest.raises(WaitTimeout) as failed:
        wait_until(lambda: output, 0, "a prompt", until=lambda text: text.endswith("$ "))
    message = str(failed.value)
    assert "'start " in message and " end'" in message and len(message) < SHOWN + 200
