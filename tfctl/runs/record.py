"""What the run store keeps of a run: its hosts, its tasks as started, and how it went.

Stored as JSON in run.json; every field here is read back by `RunRecord.from_json`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tfctl.config.model import host_port
from tfctl.supervisor.protocol import RunState
from tfctl.transport.specs import LocalSpec, TransportSpec, read_spec

if TYPE_CHECKING:
    from tfctl.transport.base import Transport


@dataclass(frozen=True)
class HostSpec:
    """How to reach one host and where its supervisor keeps its files."""

    name: str
    python: str | None
    root: str
    transport: TransportSpec = field(default_factory=LocalSpec)

    @property
    def shares_files(self) -> bool:
        """The host sees this machine's files: nothing is synced to it."""
        return self.transport.SHARES_FILES

    def connect(self, accept_new_host_keys: bool = False) -> Transport:
        """Its transport; constructing it does no I/O."""
        return self.transport.connect(self.name, accept_new_host_keys)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "python": self.python, "root": self.root, "transport": self.transport.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostSpec:
        return cls(data["name"], data["python"], data["root"], read_spec(data.get("transport") or {}))


@dataclass(frozen=True)
class TaskSpec:
    """One task as started: everything needed to start, find, or explain it again."""

    job: str
    index: int
    host: str
    port: int
    command: str
    env: dict[str, str]
    cwd: str | None
    restart: dict[str, Any] | None = None  # model.RestartPolicy's fields, when the job restarts its tasks
    gpus: tuple[int, ...] | None = None  # its CUDA_VISIBLE_DEVICES as placed (`devices.Placement`)
    cpus: tuple[int, ...] | None = None  # the cores it runs on; None: any

    def __post_init__(self) -> None:
        for name in ("gpus", "cpus"):  # JSON gives lists back
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)


@dataclass(frozen=True)
class RunRecord:
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
    progress: dict[str, Any] = field(default_factory=dict)  # model.ProgressSettings's fields
    logdir: str | None = None  # the cluster file's `logdir`, {run_id} filled in; relative to a task's cwd
    backend: str = "ssh"  # the cluster file's `backend:`, which runs the tasks (`tfctl.backends`)
    backend_state: dict[str, Any] | None = None  # what the backend holds for the run, in its wire form
    left_nothing: bool = False  # a stop proved no process of the run left and its ports free on every host

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RunState(self.state))  # a plain string from JSON or a caller

    @property
    def active(self) -> bool:
        return not self.state.is_final

    def task(self, name: str) -> TaskSpec:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "hosts": [h.to_json() for h in self.hosts], "state": self.state.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        """Raises ValueError for a record that is not one (hand-edited, truncated, another version)."""
        data = dict(data)
        if not isinstance(data.get("created_at"), (int, float)) or isinstance(data.get("created_at"), bool):
            raise ValueError("created_at is not a timestamp")
        data["tasks"] = tuple(TaskSpec(**t) for t in data["tasks"])
        data["hosts"] = tuple(HostSpec.from_json(h) for h in data["hosts"])
        if "allocation" in data:  # written before backends were peers: only a scheduler's runs had one
            allocation = data.pop("allocation")
            if allocation is not None:
                data["backend"], data["backend_state"] = data["hosts"][0].transport.KIND, allocation
        data["decisive"] = tuple(data.get("decisive", ()))
        data["essential"] = tuple(data.get("essential", ()))
        return cls(**data)
