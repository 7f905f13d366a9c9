"""Timed events, for the benchmark and for anyone asking where the time of a command goes.

Off unless `TFCTL_TRACE` names a file (`tfctl --trace FILE` sets it); then every span appends one
JSON line: {"event", "host", "start" (epoch seconds), "seconds", "pid", "thread", ...fields}.
Spans cost one environment lookup when tracing is off.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from typing import Any, Callable, Iterator, TypeVar, cast

TRACE_ENV = "TFCTL_TRACE"
_lock = threading.Lock()


def enabled() -> bool:
    return bool(os.environ.get(TRACE_ENV))


def record(event: str, host: str = "", start: float | None = None, seconds: float = 0.0, **fields: Any) -> None:
    """Append one event to the trace file, if tracing is on."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = {
        "event": event,
        "host": host,
        "start": time.time() if start is None else start,
        "seconds": seconds,
        "pid": os.getpid(),
        "thread": threading.get_ident(),
        **fields,
    }
    with _lock, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, default=str) + "\n")


@contextlib.contextmanager
def span(event: str, host: str = "", **fields: Any) -> Iterator[None]:
    """Time the body; the event records the exception's type if the body raised."""
    if not enabled():
        yield
        return
    start, began = time.time(), time.perf_counter()
    try:
        yield
    except BaseException as e:
        fields["error"] = type(e).__name__
        raise
    finally:
        record(event, host, start, time.perf_counter() - began, **fields)


F = TypeVar("F", bound=Callable[..., Any])


def traced(event: str) -> Callable[[F], F]:
    """Decorator: a span around every call of the function."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with span(event):
                return fn(*args, **kwargs)

        return cast(F, timed)

    return wrap
