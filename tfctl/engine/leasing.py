"""Renewing a run's lease on its hosts: which hosts to ask now, on the time passed in.

An attached controller starts its tasks with a lease (`lease_timeout`): a host whose controller
stops renewing it stops the run's tasks by itself. Six renewals per lease period, so a few lost
to a slow link do not cost the run; each host on its own, so one that does not answer (frozen)
is skipped while its renewal is under way and never delays the others'. The driver
(`Cluster`'s lease thread) asks `due`, sends each renewal, and tells `answered`.
"""

from __future__ import annotations

from typing import Iterable

RENEWALS_PER_LEASE = 6


class Leases:
    """The hosts whose lease is kept, and those with a renewal still under way."""

    def __init__(self, lease_timeout: float) -> None:
        self.every = lease_timeout / RENEWALS_PER_LEASE
        self.held: set[str] = set()
        self._under_way: set[str] = set()

    def hold(self, hosts: Iterable[str]) -> None:
        """Keep these hosts' lease too (their tasks started with one)."""
        self.held.update(hosts)

    def leave(self, host: str) -> None:
        """`host` is no longer the run's (its tasks moved): renewed no more."""
        self.held.discard(host)

    def due(self) -> list[str]:
        """The hosts to renew now, marked under way until `answered`."""
        now = sorted(self.held - self._under_way)
        self._under_way.update(now)
        return now

    def answered(self, host: str) -> None:
        """A renewal ended (renewed or failed: the next one tries again; a host silent for
        `host_timeout` fails the run, as the supervision decides)."""
        self._under_way.discard(host)
