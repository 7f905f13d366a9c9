"""What the run store keeps of a run: its hosts, its tasks as started, and how it went.

Stored as JSON in run.json: typed records on the one base (`Wire`), written by `to_wire` and
read back by `from_wire`, so every field here is read back as the type it was written as.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from tfctl.config.model import DEFAULT_PROGRESS_WINDOW, DEFAULT_STALL_TIMEOUT, host_port
from tfctl.supervisor.protocol import RestartRule, RunState
from tfctl.supervisor.records import Wire, field, record


@record
class HostSpec(Wire):
    """How to reach one host and where its supervisor keeps its files."""

    name: str
    python: str | None
    root: str
    transport: dict[str, Any] = field(default_factory=dict)

    @property
    def shares_files(self) -> bool:
        """This machine, or a Slurm node (Slurm clusters share the filesystem with the login node)."""
        return self.transport.get("kind") in ("local", "slurm")


@record
class RestartSpec(Wire):
    """When a task of the job that ended is started again (the job's `model.RestartPolicy`)."""

    policy: str  # on-failure | exit-code (a job whose tasks never restart keeps no RestartSpec)
    max_restarts: int
    backoff: float  # seconds before each restart

    def rule(self) -> RestartRule:
        """As the task's supervisor applies it."""
        return RestartRule(self.policy, self.max_restarts, self.backoff)


@record
class ProgressSpec(Wire):
    """How `status` reads the run's training progress (the cluster file's `model.ProgressSettings`)."""

    regex: str | None = None  # replaces the built-in shapes (`tf/progress.py`)
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # no step for this long: `stalled`
    window: float = DEFAULT_PROGRESS_WINDOW  # steps/s is measured over this many seconds


@record
class TaskSpec(Wire):
    """One task as started: everything needed to start, find, or explain it again."""

    NESTED: ClassVar[Mapping[str, Any]] = {"restart": ("one", RestartSpec)}
    TUPLES: ClassVar[tuple[str, ...]] = ("gpus", "cpus")

    job: str
    index: int
    host: str
    port: int
    command: str
    env: dict[str, str]
    cwd: str | None
    restart: RestartSpec | None = None  # when the job restarts its tasks
    gpus: tuple[int, ...] | None = None  # its CUDA_VISIBLE_DEVICES as placed (`devices.Placement`)
    cpus: tuple[int, ...] | None = None  # the cores it runs on; None: any

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)


@record
class RunRecord(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {
        "tasks": ("tuple", TaskSpec),
        "hosts": ("tuple", HostSpec),
        "progress": ("one", ProgressSpec),
    }
    ENUMS: ClassVar[Mapping[str, Any]] = {"state": RunState}
    TUPLES: ClassVar[tuple[str, ...]] = ("decisive", "essential")

    run_id: str
    cluster_name: str
    cluster_file: str
    created_at: float
    tasks: tuple[TaskSpec, ...]
    hosts: tuple[HostSpec, ...]
    grace_period: float
    decisive: tuple[str, ...] = ()
    essential: tuple[str, ...] = ()
    hang_timeout: float | None = None
    startup_timeout: float = 120.0
    lease_timeout: float = 0.0  # held by an attached `up` only; 0 for detached runs
    idle_timeout: float = 0.0  # the idle rule of tasks that never end by themselves; 0: off
    host_timeout: float = 120.0  # a host silent this long fails the run
    unreachable: dict[str, float] = field(default_factory=dict)  # host -> since (epoch), per the controller
    store: str = ""
    state: RunState = RunState.STARTING
    ended_at: float | None = None
    reason: str | None = None
    watcher: dict[str, Any] | None = None
    progress: ProgressSpec = ProgressSpec()
    logdir: str | None = None  # the cluster file's `logdir`, {run_id} filled in; relative to a task's cwd
    allocation: dict[str, Any] | None = None  # backend slurm: {"job_id", "owned"} (`slurm/backend.py`)
    left_nothing: bool = False  # a stop proved no process of the run left and its ports free on every host

    @property
    def active(self) -> bool:
        return not self.state.is_final

    def task(self, name: str) -> TaskSpec:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return self.to_wire()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """Raises ValueError for a record that is not one (hand-edited, truncated, another version)."""
        if not isinstance(data, Mapping):
            raise ValueError("it is not a JSON object")
        created = data.get("created_at")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ValueError("created_at is not a timestamp")
        return cls.from_wire(data)
