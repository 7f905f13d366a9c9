"""Parallel fan-out over hosts: one call per host, every host's outcome reported.

A failing host never hides the others: callers get `.succeeded` and `.failed` and decide.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

from tfctl.errors import HostError, TfctlError

T = TypeVar("T")
H = TypeVar("H")
MAX_PARALLEL = 32


@dataclass
class GroupResult(Generic[T]):
    """Per-host outcome of one fan-out: a value, or the exception that host raised."""

    succeeded: dict[str, T] = field(default_factory=dict)
    failed: dict[str, Exception] = field(default_factory=dict)

    def raise_if_failed(self, what: str) -> None:
        """One error that lists every failed host, so the user fixes them all in one go."""
        if not self.failed:
            return
        if len(self.failed) == 1:
            ((host, err),) = self.failed.items()
            if isinstance(err, TfctlError):
                raise err
            raise HostError(host, f"{what} failed: {err}")
        lines = [f"{what} failed on {len(self.failed)} hosts:"]
        lines += [f"  {host}: {getattr(err, 'message', err)}" for host, err in sorted(self.failed.items())]
        raise TfctlError("\n".join(lines))


def fan_out(
    items: Iterable[H],
    name: Callable[[H], str],
    fn: Callable[[H], T],
    max_parallel: int = MAX_PARALLEL,
    deadline: float | None = None,
    deadlines: Mapping[str, float] | None = None,
) -> GroupResult[T]:
    """Call `fn` on every item in parallel (bounded) and collect results by `name(item)`.

    With `deadline` (seconds), an item that has not answered by then is a failure (`HostError`:
    no answer) and is not waited for: a frozen host never holds the others' answers hostage. Its
    call goes on in a daemon thread until its own timeout ends it, and never delays an exit.
    `deadlines`: a shorter deadline of some items' own (a host already judged lost)."""
    items = list(items)
    result: GroupResult[T] = GroupResult()
    if not items:
        return result
    keys = [name(item) for item in items]
    outcomes: dict[str, tuple[bool, Any]] = {}
    finished = threading.Condition()
    slots = threading.Semaphore(max_parallel)

    def run(key: str, item: H) -> None:
        with slots:
            try:
                outcome: tuple[bool, Any] = (True, fn(item))
            except BaseException as e:  # noqa: BLE001 - every host's failure is reported, whatever it is
                outcome = (False, e)
        with finished:
            outcomes[key] = outcome
            finished.notify_all()

    for key, item in zip(keys, items):
        threading.Thread(target=run, args=(key, item), daemon=True, name=f"fan-out {key}").start()
    began = time.monotonic()
    allowed: dict[str, float | None] = {key: (deadlines or {}).get(key, deadline) for key in keys}
    ends = {key: None if (limit := allowed[key]) is None else began + limit for key in keys}
    with finished:
        while True:
            waiting = [ends[key] for key in keys if key not in outcomes]
            if not waiting:
                break
            last = None if None in waiting else max(e for e in waiting if e is not None)
            left = None if last is None else last - time.monotonic()
            if left is not None and left <= 0:
                break
            finished.wait(left)
        answered = dict(outcomes)
    for key in keys:
        if key not in answered:
            result.failed[key] = HostError(key, f"no answer within {allowed[key]:g}s")
        elif answered[key][0]:
            result.succeeded[key] = answered[key][1]
        elif isinstance(answered[key][1], Exception):
            result.failed[key] = answered[key][1]
        else:
            raise answered[key][1]  # an interrupt (Ctrl-C) inside a call is the caller's, as if not in a thread
    return result
