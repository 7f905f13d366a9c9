"""The fake backend itself and the lab of in-process hosts it runs on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tests.fake_backend.settings import FakeSettings
from tests.fake_backend.transport import FakeSpec
from tests.fakes import FakeHost, Journal, TaskScript
from tfctl.backends.base import Acquired, BackendReport, Progress, PruneTarget
from tfctl.config.model import ClusterConfig
from tfctl.engine.clock import FakeClock
from tfctl.engine.resubmission import AllocationOver
from tfctl.errors import BackendError, UsageError
from tfctl.runs.record import HostSpec, RunRecord


@dataclass
class Lab:
    """The hosts fake runs use, and what the backend did: one per test (`fake_backend` fixture)."""

    journal: Journal = field(default_factory=Journal)
    scripts: dict[str, TaskScript] = field(default_factory=dict)  # task name -> its scripted life
    hosts: dict[str, FakeHost] = field(default_factory=dict)
    leases: dict[str, str] = field(default_factory=dict)  # run id -> pool it holds
    released: list[str] = field(default_factory=list)
    refuse: str | None = None  # acquire raises this
    ended: dict[str, str] = field(default_factory=dict)  # run id -> why the backend ended it under its tasks
    acquired: list[str] = field(default_factory=list)  # run ids, once per lease taken (a resubmission too)
    # The lab's time: each wait of a run's supervision passes at once (its hosts answer at once,
    # and their tasks live by the looks they get), so a test needs no faster poll.
    clock: FakeClock = field(default_factory=lambda: FakeClock(time.monotonic(), time.time()))

    def agent(self, host: str) -> FakeHost:
        if host not in self.hosts:
            self.hosts[host] = FakeHost(host, self.journal, self.scripts)
        return self.hosts[host]

    def end_run(self, run_id: str, why: str = "ENDED") -> None:
        """End the run's lease under its tasks; TIMEOUT and PREEMPTED are ends a run goes on after."""
        self.ended[run_id] = why


LAB = Lab()


def reset() -> Lab:
    global LAB
    LAB = Lab()
    return LAB


def _pool(config: ClusterConfig) -> str:
    settings = config.backend_settings
    return settings.pool if isinstance(settings, FakeSettings) else "default"


class FakeBackend:
    name = "fake"
    host_word = "fake host"
    waiting_for: str | None = "the fake pool"
    places_devices = False

    @property
    def clock(self) -> FakeClock:
        return LAB.clock

    def stand_in(self, config: ClusterConfig, *, per_task: bool = False) -> tuple[ClusterConfig, str | None]:
        return config, "backend fake: the tests' in-process hosts"

    def check_refusal(self, config: ClusterConfig) -> UsageError | None:
        return None

    def spares(self, config: ClusterConfig) -> tuple[str, ...]:
        settings = config.backend_settings
        return settings.spares if isinstance(settings, FakeSettings) else ()

    def acquire(self, config: ClusterConfig, run_id: str, progress: Progress) -> Acquired:
        if LAB.refuse:
            raise BackendError(LAB.refuse)
        LAB.leases[run_id] = _pool(config)
        LAB.ended.pop(run_id, None)  # a new lease for a run whose last one ended: it holds
        LAB.acquired.append(run_id)
        progress("fake", f"leased pool {_pool(config)}")
        settings = config.backend_settings
        resubmits = settings.resubmit if isinstance(settings, FakeSettings) else 0
        return Acquired(config, {"pool": _pool(config)}, resubmits)

    def host_spec(self, config: ClusterConfig, host: str, state: Mapping[str, Any] | None) -> HostSpec:
        settings = config.backend_settings
        remote = isinstance(settings, FakeSettings) and host in settings.remote
        return HostSpec(host, config.python_for(host), "~/.tfctl" if remote else "/fake/.tfctl", FakeSpec(remote))

    def monitor_launcher(self, record: RunRecord) -> None:
        return None

    def allocation_end(self, record: RunRecord) -> str | None:
        return f"the fake pool ended run {record.run_id}" if record.run_id in LAB.ended else None

    def is_over(self, record: RunRecord) -> bool:
        return record.run_id in LAB.ended

    def why_over(self, record: RunRecord, progress: Progress) -> AllocationOver | None:
        why = LAB.ended.get(record.run_id)
        return None if why is None else AllocationOver(why, why in ("TIMEOUT", "PREEMPTED"))

    def release(self, record: RunRecord) -> BackendReport | None:
        if LAB.leases.pop(record.run_id, None) is None:
            return None
        LAB.released.append(record.run_id)
        return BackendReport("fake pool", "released", True, {"pool": (record.backend_state or {}).get("pool")})

    def hand_over(self, record: RunRecord) -> Mapping[str, Any] | None:
        return None  # the controller runs in `up`, not in the lease

    def run_elsewhere(self, config, detach, out, err, abandoned, resume=None) -> int | None:
        return None  # the controller runs in `up`, as over ssh

    def report(self, record: RunRecord) -> BackendReport:
        held = record.run_id in LAB.leases
        return BackendReport("fake pool", "leased" if held else "released", not held, dict(record.backend_state or {}))

    def door_relay(self, record: RunRecord, door: Path) -> list[str] | None:
        return None  # the controller runs in `up`, as over ssh

    def prune_targets(self, record: RunRecord) -> tuple[PruneTarget, ...]:
        return tuple(PruneTarget(spec) for spec in record.hosts)


BACKEND = FakeBackend()
