"""Parallel fan-out over hosts: one call per host, every host's outcome reported.

A failing host never hides the others: callers get `.succeeded` and `.failed` and decide.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, TypeVar

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
    items: Iterable[H], name: Callable[[H], str], fn: Callable[[H], T], max_parallel: int = MAX_PARALLEL
) -> GroupResult[T]:
    """Call `fn` on every item in parallel (bounded) and collect results by `name(item)`."""
    items = list(items)
    result: GroupResult[T] = GroupResult()
    if not items:
        return result
    with ThreadPoolExecutor(max_workers=min(max_parallel, len(items))) as pool:
        futures = {name(item): pool.submit(fn, item) for item in items}
    for key, future in futures.items():
        try:
            result.succeeded[key] = future.result()
        except Exception as e:  # noqa: BLE001 - every host's failure is reported, whatever it is
            result.failed[key] = e
    return result
