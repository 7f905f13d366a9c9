"""Tasks on the hosts the cluster file lists: this machine directly, others over SSH.

Nothing is acquired or released: the hosts are there. Each host's supervisor forks the tasks'
monitors, and a run ends with its tasks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping

from tfctl.backends.base import Acquired, BackendReport, Progress, PruneTarget
from tfctl.backends.ssh.settings import SSHBackendSettings
from tfctl.cluster.agent import REMOTE_ROOT
from tfctl.config.home import tfctl_home
from tfctl.config.model import ClusterConfig, HostConfig, SSHSettings
from tfctl.engine.clock import REAL_CLOCK, Clock
from tfctl.engine.resubmission import AllocationOver
from tfctl.errors import UsageError
from tfctl.runs.record import HostSpec, RunRecord
from tfctl.transport import is_local_name
from tfctl.transport.specs import LocalSpec, SSHSpec


class SSHBackend:
    name = "ssh"
    host_word = "host"
    waiting_for: str | None = None
    places_devices = False
    clock: Clock = REAL_CLOCK

    def stand_in(self, config: ClusterConfig, *, per_task: bool = False) -> tuple[ClusterConfig, str | None]:
        return config, None  # every task is on a host of the file's

    def check_refusal(self, config: ClusterConfig) -> UsageError | None:
        return None

    def acquire(self, config: ClusterConfig, run_id: str, progress: Progress) -> Acquired:
        return Acquired(config)

    def spares(self, config: ClusterConfig) -> tuple[str, ...]:
        settings = config.backend_settings
        return settings.spares if isinstance(settings, SSHBackendSettings) else ()

    def host_spec(self, config: ClusterConfig, host: str, state: Mapping[str, Any] | None) -> HostSpec:
        """This machine for a local name (or `local: true`), else SSH with the host's settings
        over the cluster's."""
        own = config.hosts.get(host) or HostConfig(host)
        python = config.python_for(host)
        local = own.local if own.local is not None else is_local_name(host)
        if local:
            return HostSpec(host, python, str(tfctl_home()), LocalSpec())
        merged = {
            f.name: getattr(own.ssh, f.name) if getattr(own.ssh, f.name) is not None else getattr(config.ssh, f.name)
            for f in dataclasses.fields(SSHSettings)
        }
        spec = SSHSpec(
            destination=merged["destination"],
            user=merged["user"],
            port=merged["port"],
            identity_file=merged["identity_file"],
            ssh_config_path=merged["config"],
            connect_timeout=merged["connect_timeout"],
            keepalive=merged["keepalive"],
        )
        return HostSpec(host, python, REMOTE_ROOT, spec)

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
