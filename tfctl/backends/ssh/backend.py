"""Tasks on the hosts the cluster file lists (or its pool has free): this machine directly,
others over SSH.

Nothing is acquired or released: the hosts are there (a pool's are placed on at start, and each
task claims its share of its host itself, freed when it ends). Each host's supervisor forks the tasks'
monitors, and a run ends with its tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from tfctl.backends.base import Acquired, BackendReport, Progress, PruneTarget
from tfctl.backends.ssh.settings import SSHBackendSettings
from tfctl.cluster import hosts, pooling
from tfctl.config.model import ClusterConfig
from tfctl.engine.clock import REAL_CLOCK, Clock
from tfctl.engine.resubmission import AllocationOver
from tfctl.errors import UsageError
from tfctl.runs.record import HostSpec, RunRecord


class SSHBackend:
    name = "ssh"
    host_word = "host"
    waiting_for: str | None = None
    places_devices = False
    clock: Clock = REAL_CLOCK

    def stand_in(self, config: ClusterConfig, *, per_task: bool = False) -> tuple[ClusterConfig, str | None]:
        if config.pool is not None:  # placed on the pool's capacities, as if nothing held them
            return pooling.place_empty(config), f"placed on pool {config.pool} as if nothing else held it"
        return config, None  # every task is on a host of the file's

    def check_refusal(self, config: ClusterConfig) -> UsageError | None:
        return None

    def acquire(self, config: ClusterConfig, run_id: str, progress: Progress) -> Acquired:
        if config.pool is not None:  # its hosts are what its pool has free now
            return Acquired(pooling.place_now(config, progress))
        return Acquired(config)

    def spares(self, config: ClusterConfig) -> tuple[str, ...]:
        settings = config.backend_settings
        return settings.spares if isinstance(settings, SSHBackendSettings) else ()

    def host_spec(self, config: ClusterConfig, host: str, state: Mapping[str, Any] | None) -> HostSpec:
        """This machine for a local name (or `local: true`), else SSH with the host's settings
        over the cluster's."""
        return hosts.reach(host, config.hosts.get(host), config.ssh, config.python_for(host))

    def monitor_launcher(self, record: RunRecord) -> None:
        return None

    def allocation_end(self, record: RunRecord) -> str | None:
        return None  # its hosts are the file's: no allocation ends under a run

    def is_over(self, record: RunRecord) -> bool:
        return False

    def why_over(self, record: RunRecord, progress: Progress) -> AllocationOver | None:
        return None  # the hosts never end under a run: nothing to resubmit

    def release(self, record: RunRecord) -> BackendReport | None:
        return None

    def hand_over(self, record: RunRecord) -> Mapping[str, Any] | None:
        return None  # the controller never dies with the hosts

    def report(self, record: RunRecord) -> BackendReport | None:
        return None

    def run_elsewhere(
        self,
        config: ClusterConfig,
        detach: bool,
        out: Callable[[str], None],
        err: Callable[[str], None],
        abandoned: Callable[[str], None],
        resume: str | None = None,
    ) -> int | None:
        return None  # the controller is always `up` itself, or its watcher

    def door_relay(self, record: RunRecord, door: Path) -> list[str] | None:
        return None  # the controller runs where `up` ran: its door is there

    def prune_targets(self, record: RunRecord) -> tuple[PruneTarget, ...]:
        return tuple(PruneTarget(spec) for spec in record.hosts)


BACKEND = SSHBackend()
