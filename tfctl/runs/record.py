"""What the run store keeps of a run: its hosts, its tasks as started, and how it went.

Stored as JSON in run.json: typed records on the one base (`Wire`), written by `to_wire` and
read back by `from_wire`, so every field here is read back as the type it was written as.

A record says its `schema_version`. `RunRecord.from_json` reads a record of an older version by
migrating it one version at a time (`MIGRATIONS`), so runs recorded by an older tfctl stay
readable; a record of a newer version is refused (`NewerRecordError`), never guessed at.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from tfctl.config.model import DEFAULT_PROGRESS_WINDOW, DEFAULT_STALL_TIMEOUT, host_port
from tfctl.supervisor.protocol import ClaimAsk, ContainerLaunch, RestartRule, RunState
from tfctl.supervisor.records import Wire, field, record
from tfctl.transport.specs import LocalSpec, TransportSpec, read_spec

if TYPE_CHECKING:
    from tfctl.transport.base import Transport

SCHEMA_VERSION = 2  # of the records this tfctl writes; `MIGRATIONS` reads every older one


@record
class HostSpec(Wire):
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

    def to_wire(self) -> dict[str, Any]:
        """The transport's spec says its kind, so it is read back as the spec it was."""
        return {"name": self.name, "python": self.python, "root": self.root, "transport": self.transport.to_json()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> HostSpec:
        if not isinstance(data, Mapping):
            raise ValueError(f"HostSpec: expected an object, got {data!r}")
        return cls(data["name"], data.get("python"), data["root"], read_spec(data.get("transport") or {}))


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
    on_stall: str = "warn"  # what the run's controller does with a stalled task (`model.STALL_ACTIONS`)
    metrics: dict[str, str] = field(default_factory=dict)  # the cluster file's `metrics:` (`tf/results.py`)


@record
class TaskSpec(Wire):
    """One task as started: everything needed to start, find, or explain it again."""

    NESTED: ClassVar[Mapping[str, Any]] = {
        "restart": ("one", RestartSpec),
        "container": ("one", ContainerLaunch),
        "claims": ("one", ClaimAsk),
    }
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
    container: ContainerLaunch | None = None  # the container it runs in; None: bare on its host
    claims: ClaimAsk | None = None  # placed on a pool: what it claims on its host at start

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)


@record
class Move(Wire):
    """A lost host's task started on a spare (`controller/live/spares.py`): kept on the record so
    `status` can show where a task went, and why."""

    TUPLES: ClassVar[tuple[str, ...]] = ("restarted",)

    at: float  # epoch seconds
    task: str
    from_host: str
    to_host: str
    why: str
    restarted: tuple[str, ...] = ()  # the tasks elsewhere started again with the new address


@record
class Placement(Wire):
    """Where its pool placed one task, and the GPUs and cores it claims there: what rebuilds the
    run's hosts from its cluster file (`pool:` asks, it names no hosts) in a watcher started anew."""

    task: str
    host: str
    gpus: tuple[int, ...] = ()
    cpus: int = 0


@record
class TrackerRun(Wire):
    """The experiment tracker's run a tfctl run logs into (`tfctl/tracking/`): made at its first
    start, taken on by `--resume` and every new allocation, so the run's whole life is one."""

    TUPLES: ClassVar[tuple[str, ...]] = ("missed",)

    kind: str  # the tracker: `mlflow` or `wandb` (`tracking.trackers`)
    run_id: str  # the tracker's own id of it
    url: str = ""  # where a person sees it ("" where the tracker has no page: W&B offline)
    uri: str = ""  # the server it is kept on (MLflow)
    experiment: str = ""  # MLflow's experiment name, W&B's project
    experiment_id: str = ""
    artifacts: str = ""  # MLflow's artifact location of the run
    group: str = ""  # W&B's group: the sweep, else the cluster
    entity: str = ""
    mode: str = ""  # W&B's WANDB_MODE ("": its default)
    parent: str = ""  # the sweep's run it is nested in (MLflow)
    closed: bool = False  # told of the run's end (once, by whoever recorded it first)
    missed: tuple[str, ...] = ()  # what of the end could not be logged, in words


@record
class AllocationEnd(Wire):
    """An allocation the run outlived: its scheduler ended it (time limit, preemption) and the
    run went on in a new one."""

    label: str  # as the backend names it (`BackendReport.label`)
    ended_at: float
    why: str  # in the scheduler's words: TIMEOUT, PREEMPTED


class ControllerKind(str, enum.Enum):
    """Which process controls a run."""

    UP = "up"  # the attached `tfctl up` that started it
    WATCHER = "watcher"  # a detached watcher (`up -d`, or one started for a run whose controller died)

    def __str__(self) -> str:
        return self.value


@record
class Controller(Wire):
    """The process that controls a run, and how to tell it from a later process with its pid:
    its kernel start time, and the machine it runs on (a run store on a shared home is read from
    other machines, where that pid means nothing)."""

    ENUMS: ClassVar[Mapping[str, Any]] = {"kind": ControllerKind}

    kind: ControllerKind
    pid: int
    starttime: int | None  # in clock ticks since boot (/proc/<pid>/stat); None: unknown
    host: str | None = None  # `files.host_key()`; None: not noted, taken as this machine

    @property
    def attached(self) -> bool:
        return self.kind is ControllerKind.UP


@record
class RunRecord(Wire):
    """One run: what was started where, who controls it, and how it went."""

    NESTED: ClassVar[Mapping[str, Any]] = {
        "tasks": ("tuple", TaskSpec),
        "hosts": ("tuple", HostSpec),
        "lost_hosts": ("tuple", HostSpec),
        "progress": ("one", ProgressSpec),
        "watcher": ("one", Controller),
        "moves": ("tuple", Move),
        "allocations": ("tuple", AllocationEnd),
        "placement": ("tuple", Placement),
        "tracking": ("tuple", TrackerRun),
    }
    ENUMS: ClassVar[Mapping[str, Any]] = {"state": RunState}
    TUPLES: ClassVar[tuple[str, ...]] = ("decisive", "essential", "notify", "spares")
    schema_version: ClassVar[int] = SCHEMA_VERSION  # of every record in memory: older ones are migrated

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
    watcher: Controller | None = None  # who controls the run while it is active
    progress: ProgressSpec = ProgressSpec()
    logdir: str | None = None  # the cluster file's `logdir`, {run_id} filled in; relative to a task's cwd
    backend: str = "ssh"  # the cluster file's `backend:`, which runs the tasks (`tfctl.registry.backends`)
    backend_state: dict[str, Any] | None = None  # what the backend holds for the run, in its wire form
    left_nothing: bool = False  # a stop proved no process of the run left and its ports free on every host
    resumes: str | None = None  # the earlier run whose files (checkpoints) this one continues from
    notify: tuple[str, ...] = ()  # the cluster file's `notify:` commands, run by the run's controller
    spares: tuple[str, ...] = ()  # hosts (in `hosts`, set up like the others) not yet given a lost host's tasks
    moves: tuple[Move, ...] = ()  # tasks moved to a spare, in order
    lost_hosts: tuple[HostSpec, ...] = ()  # hosts whose tasks moved, not yet seen to stop what they ran
    resubmits: int = 0  # new allocations the backend may ask for when one ends under the run
    allocations: tuple[AllocationEnd, ...] = ()  # those that ended under it, oldest first
    versions: dict[str, str] = field(default_factory=dict)  # "tfctl", then per host its python and TF
    accounting: dict[str, Any] | None = None  # wall time, CPU- and GPU-hours, once stopped (`runs.accounting`)
    result: dict[str, Any] | None = None  # its final evaluation's numbers, read once stopped (`tf/results.py`)
    params: dict[str, Any] = field(default_factory=dict)  # the cluster file's `params:`, as this run had them
    param_texts: dict[str, str] = field(default_factory=dict)  # the same as written or typed (`0.010`)
    sweep: str | None = None  # the sweep it is a trial of (`sweeps.store`); None: a run of its own
    trial: int | None = None  # its trial's place in that sweep
    cut_off: bool = False  # its controller died before every task ran: no fault of the run's own
    priority: int | None = None  # `submit --priority`; None: started by `up`, never queued
    pool: str | None = None  # the pool file its queue places it on (`submit`); None: not queued
    placement: tuple[Placement, ...] = ()  # where its pool placed its tasks; () for listed hosts
    stopping_since: float | None = None  # a `down` began stopping it then: its end is the down's to record
    tracking: tuple[TrackerRun, ...] = ()  # the tracker runs it logs into (`tracking:`); () when off

    @property
    def trial_of(self) -> tuple[str | None, int | None]:
        """(sweep, trial): runs with the same cluster file and this pair are one run's attempts,
        for the one-live-run rule; (None, None) for a run `up` started."""
        return (self.sweep, self.trial)

    def params_text(self) -> str:
        """`lr=0.01 batch=64`: the parameters it ran with, as `--set` gives them ("" for none)."""
        return params_text(self.params)

    def tracking_json(self) -> list[dict[str, Any]]:
        """Its tracker runs as `status --json` and `runs --json` give them."""
        return [
            {"tracker": t.kind, "run_id": t.run_id, "url": t.url or None, "missed": list(t.missed)}
            for t in self.tracking
        ]

    def tracking_text(self) -> str:
        """`mlflow http://...`: where its tracker runs are ("" when it has none)."""
        return "  ".join(f"{t.kind} {t.url or t.run_id}" for t in self.tracking if t.url or t.run_id)

    def allocation_text(self) -> str | None:
        """`allocation 2 of 3 (1st ended: TIMEOUT at 12:03)`; None for a run that cannot move."""
        if not self.resubmits:
            return None
        text = f"allocation {len(self.allocations) + 1} of {self.resubmits + 1}"
        ends = [
            f"{_ordinal(n)} ended: {end.why} at {time.strftime('%H:%M', time.localtime(end.ended_at))}"
            for n, end in enumerate(self.allocations, 1)
        ]
        return text + (f" ({'; '.join(ends)})" if ends else "")

    @property
    def active(self) -> bool:
        return not self.state.is_final

    def task(self, name: str) -> TaskSpec:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **self.to_wire()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """The record, migrated to this version if it is of an older one. Raises NewerRecordError
        for a record of a newer tfctl, ValueError for one that is not a record (hand-edited, truncated)."""
        if not isinstance(data, Mapping):
            raise ValueError("it is not a JSON object")
        version = data.get("schema_version", 1)  # version 1 did not say so
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"schema_version {version!r} is not a version")
        if version > SCHEMA_VERSION:
            raise NewerRecordError(version)
        for older in range(version, SCHEMA_VERSION):
            data = MIGRATIONS[older](data)
        created = data.get("created_at")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ValueError("created_at is not a timestamp")
        return cls.from_wire(data)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class NewerRecordError(ValueError):
    """A record written by a newer tfctl, in a version this one cannot read."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"it was written by a newer tfctl (record version {version}; this tfctl reads up to {SCHEMA_VERSION})"
        )
        self.version = version


def _v1_to_v2(data: Mapping[str, Any]) -> dict[str, Any]:
    """Version 1 (no `schema_version`) kept its controller as a dict: {pid, starttime, host,
    attached}, where `attached` (or its absence, in the oldest records) told `up` from a watcher;
    and a scheduler's allocation as `allocation`, now the state of the backend its hosts' transport
    is named after."""
    out = {**data, "schema_version": 2}
    allocation = out.pop("allocation", None)
    if allocation is not None:  # the backend is the one whose own transport its hosts have
        kinds = [(h.get("transport") or {}).get("kind", "local") for h in data.get("hosts") or ()]
        out["backend"] = next((k for k in kinds if k not in ("local", "ssh")), "ssh")
        out["backend_state"] = allocation
    watcher = data.get("watcher")
    if watcher is not None:
        if not isinstance(watcher, Mapping) or "pid" not in watcher:
            raise ValueError(f"watcher {watcher!r} names no process")
        kind = ControllerKind.UP if watcher.get("attached") else ControllerKind.WATCHER
        out["watcher"] = {
            "kind": kind.value,
            "pid": watcher["pid"],
            "starttime": watcher.get("starttime"),
            "host": watcher.get("host"),
        }
    return out


# Version -> the step that makes a record of that version one of the next.
MIGRATIONS: dict[int, Callable[[Mapping[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def params_text(params: Mapping[str, Any]) -> str:
    """`lr=0.01 batch=64`: parameters as `--set` gives them ("" for none)."""
    return " ".join(f"{name}={_param_text(value)}" for name, value in params.items())


def _param_text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
