"""The one interface every way of running tasks implements: ssh (with localhost), Slurm, and the
tests' fake backend, as peers.

A backend answers what generic code must not decide by a backend's name: where a cluster file's
tasks may run before anything is asked for (`stand_in`), acquiring hosts (nothing over ssh, an
allocation on Slurm), how each host is reached (`host_spec`), who starts the tasks' monitors,
what ends a run besides its tasks, releasing, and what `status`/`down` say of the backend's own
state. Everything else (planning, starting, supervising, stopping) is the same for every backend.

The backend's own state for a run (Slurm's allocation) is stored in the run record in its wire
form; only the backend reads it, as its own typed record.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Protocol

from tfctl.registry import backends
from tfctl.supervisor.records import Wire, record
from tfctl.supervisor.records import field as wire_field

if TYPE_CHECKING:
    from tfctl.cluster.cluster import MonitorLauncher
    from tfctl.config.model import ClusterConfig
    from tfctl.engine.clock import Clock
    from tfctl.engine.resubmission import AllocationOver
    from tfctl.errors import UsageError
    from tfctl.runs.record import HostSpec, RunRecord

Progress = Callable[[str, str], None]  # (who, message)


@dataclass(frozen=True)
class Acquired:
    """What `acquire` got: the cluster placed on its hosts, the backend's state to store (in its
    wire form; None when the backend holds nothing for the run), and how many new allocations it
    may ask for when this one ends under the run (`AllocationOver.continues`)."""

    config: ClusterConfig
    state: Mapping[str, Any] | None = None
    resubmits: int = 0


@record
class BackendReport(Wire):
    """What a backend says of its own state for a run, for `status` and `down` (it travels through
    the live controller's door).

    `label` names the thing (`slurm job 4711`), `text` says how it is (`RUNNING`, `CANCELLED by 0`);
    `ended` is True once it holds nothing any more; `fields` go to `--json` under the backend's name.
    """

    label: str
    text: str
    ended: bool
    fields: Dict[str, Any] = wire_field(default_factory=dict)

    def line(self) -> str:
        return f"{self.label}: {self.text}"


@dataclass(frozen=True)
class PruneTarget:
    """Where a run's files are removed from: a host, and whether that host's files stand for
    every host of the run (a shared filesystem whose hosts cannot be reached any more)."""

    spec: HostSpec
    every_host: bool = False


class Backend(Protocol):
    """A way of running a cluster file's tasks. Implementations hold no state of their own."""

    name: str  # as the cluster file's `backend:` names it
    host_word: str  # what its hosts are called in messages: "host", "node"
    waiting_for: str | None  # whom `acquire` may wait for ("Slurm"): shown while waiting; None: never waits
    places_devices: bool  # it hands out GPUs and cores itself: tfctl does not place tasks on them
    clock: Clock  # what a run's supervision waits on: the real clock (the tests' in-process lab has its own)

    def stand_in(self, config: ClusterConfig, *, per_task: bool = False) -> tuple[ClusterConfig, str | None]:
        """The cluster with every task on a host, for plans made without acquiring anything
        (`up --dry-run`; `export tfjob` asks for a host `per_task`, as pods are), and a note
        saying what stands in for what."""
        ...

    def check_refusal(self, config: ClusterConfig) -> UsageError | None:
        """Why `tfctl check` cannot check this cluster's hosts before a run, if it cannot."""
        ...

    def acquire(self, config: ClusterConfig, run_id: str, progress: Progress) -> Acquired:
        """The hosts the run gets. Whatever was asked for is given back if this raises."""
        ...

    def host_spec(self, config: ClusterConfig, host: str, state: Mapping[str, Any] | None) -> HostSpec:
        """How to reach `host` and where its supervisor keeps its files."""
        ...

    def spares(self, config: ClusterConfig) -> tuple[str, ...]:
        """Hosts kept idle to take over a lost host's tasks, in the order they are used (a
        backend whose hosts are not the file's has none, and refuses a `spares:` key)."""
        ...

    def monitor_launcher(self, record: RunRecord) -> MonitorLauncher | None:
        """Who starts the run's monitors; None: each host's supervisor forks them."""
        ...

    def allocation_end(self, record: RunRecord) -> str | None:
        """Asked while the run goes on (every `engine.reconcile.ALLOCATION_EVERY` seconds): how
        its allocation ended under it, in words, which fails the run; None while it holds, or
        when the backend holds none."""
        ...

    def is_over(self, record: RunRecord) -> bool:
        """The backend knows nothing of the run can still run (its allocation ended)."""
        ...

    def why_over(self, record: RunRecord, progress: Progress) -> AllocationOver | None:
        """The run was decided (its tasks ended, or `allocation_end`): why its allocation ended, waited for
        when the tasks ended in its last moments (signalled before its time limit); None while it
        holds (the tasks ended by themselves), or when the backend never ends one."""
        ...

    def release(self, record: RunRecord) -> BackendReport | None:
        """Give back what `acquire` got for the run; its state once given back (None: nothing held)."""
        ...

    def hand_over(self, record: RunRecord) -> Mapping[str, Any] | None:
        """The run's controller is told to end (SIGTERM) as its allocation ends under the run, and
        a successor already queued takes the run up: the backend state to record for it (saying
        why). None: no successor; the controller stops the run, as for any SIGTERM."""
        ...

    def report(self, record: RunRecord) -> BackendReport | None:
        """What `status` says of the backend's own state (None: nothing to say)."""
        ...

    def run_elsewhere(
        self,
        config: ClusterConfig,
        detach: bool,
        out: Callable[[str], None],
        err: Callable[[str], None],
        abandoned: Callable[[str], None],
        resume: str | None = None,
    ) -> int | None:
        """When the run's controller runs elsewhere than this `up` (a scheduler's batch job):
        start it there (continuing run `resume`, if given) and relay its output (with `detach`,
        until its tasks run); `up`'s exit code. None: the controller runs here, in this `up`.
        `abandoned(run_id)`: a Ctrl-C here cancelled the run before any controller of its could
        record the end (its next allocation still queued)."""
        ...

    def door_relay(self, record: RunRecord, door: Path) -> list[str] | None:
        """A command that, run here, joins its stdin and stdout to the run's controller's door
        (`door`, a Unix socket: only for its own host) where that controller runs on another
        host this backend reaches (a batch job's node); None: there is no such way."""
        ...

    def prune_targets(self, record: RunRecord) -> tuple[PruneTarget, ...]:
        """Where an ended run's files are removed from."""
        ...


def backend_for(name: str) -> Backend:
    """The backend a cluster file's `backend:` names (loaded on first use), through the registry."""
    backend: Backend = importlib.import_module(f"{backends.PACKAGES[name]}.backend").BACKEND
    return backend
