"""What the Python API returns: frozen dataclasses with enums for states, built from the same
plain data the CLI prints as JSON, so the two say the same of a run."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from tfctl.supervisor.protocol import RunState, TaskState


class EventKind(enum.Enum):
    """What a `progress=` callback hears."""

    PROGRESS = "progress"  # a start's step, as `up` prints it: who ("ps:0", a host, a backend) and what
    LINE = "line"  # a line a task printed, while an attached `up` follows the run


@dataclass(frozen=True)
class Event:
    kind: EventKind
    source: str  # a task, a host, a backend, or "" for the run
    text: str


@dataclass(frozen=True)
class Metric:
    """One number of a run's result (`accuracy`, `loss`), the step it came at, the task that printed it."""

    value: float
    step: int | None = None
    task: str = ""


@dataclass(frozen=True)
class TaskInfo:
    """One task as `status --json` shows it."""

    name: str
    job: str
    index: int
    host: str
    port: int | None
    state: TaskState
    pid: int | None
    exit_code: int | None
    signal: int | None
    listening: bool
    uptime: float | None
    last_line: str
    restarts: int
    step: int | None
    steps_per_sec: float | None
    epoch: int | None
    flags: tuple[str, ...]
    diagnosis: Mapping[str, Any] | None  # `{"cause", "fix", ...}`: why it is stuck or failed
    data: Mapping[str, Any] = field(repr=False)  # every field of `status --json`, as printed

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskInfo:
        return cls(
            name=data["task"],
            job=data["job"],
            index=data["index"],
            host=data["host"],
            port=data.get("port"),
            state=TaskState(data["state"]),
            pid=data.get("pid"),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            listening=bool(data.get("listening")),
            uptime=data.get("uptime"),
            last_line=data.get("last_line") or "",
            restarts=data.get("restarts") or 0,
            step=data.get("step"),
            steps_per_sec=data.get("steps_per_sec"),
            epoch=data.get("epoch"),
            flags=tuple(data.get("flags") or ()),
            diagnosis=data.get("diagnosis"),
            data=data,
        )


@dataclass(frozen=True)
class RunStatus:
    """A run and its tasks, as `status --json` shows them (`data`: that object, whole)."""

    id: str
    cluster: str
    file: str
    state: RunState
    reason: str | None
    started_at: float
    ended_at: float | None
    tasks: tuple[TaskInfo, ...]
    result: Mapping[str, Metric]
    unreachable_hosts: Mapping[str, str]
    data: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunStatus:
        run = data["run"]
        return cls(
            id=run["id"],
            cluster=run["cluster"],
            file=run["file"],
            state=RunState(run["state"]),
            reason=run.get("reason"),
            started_at=run["started_at"],
            ended_at=run.get("ended_at"),
            tasks=tuple(TaskInfo.from_json(t) for t in data["tasks"]),
            result=metrics_of(run.get("result")),
            unreachable_hosts=dict(run.get("unreachable_hosts") or {}),
            data=data,
        )

    def task(self, name: str) -> TaskInfo:
        """The task `job:index`; KeyError if the run has none of that name."""
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class RunSummary:
    """A run as `runs --json` lists it: what its record says, no host asked."""

    id: str
    cluster: str
    file: str
    state: RunState
    created_at: float
    ended_at: float | None
    reason: str | None
    resumes: str | None
    result: Mapping[str, Metric]

    @property
    def active(self) -> bool:
        return not self.state.is_final


@dataclass(frozen=True)
class QueueEntry:
    """A run of the queue (`tfctl.queue`): its place while it waits (None once started) and why
    it waits, or how it ended."""

    id: str
    state: RunState
    priority: int
    position: int | None
    why: str | None
    submitted_at: float
    pool: str


@dataclass(frozen=True)
class Ended:
    """How a run ended, as its record keeps it (`Run.wait`); a failed one also names the task
    that failed it and the diagnosis `status` shows of that task (None: it has none)."""

    id: str
    state: RunState
    reason: str | None
    ended_at: float | None
    result: Mapping[str, Metric]
    task: str | None = None
    diagnosis: Mapping[str, Any] | None = None

    @property
    def succeeded(self) -> bool:
        return self.state is RunState.SUCCEEDED


@dataclass(frozen=True)
class Stopped:
    """What `Run.down` stopped, and what it could not prove gone (empty mappings: nothing)."""

    processes: int
    hosts: int
    ended: int  # tasks that had ended already when the stop began
    remaining: Mapping[str, tuple[int, ...]]  # host -> pids still there
    unreachable: Mapping[str, str]  # host -> why it could not be asked
    containers_left: Mapping[str, tuple[str, ...]]
    released: str | None  # what the backend said once it let go of the run's allocation (None: it held none)

    @property
    def clean(self) -> bool:
        return not self.remaining and not self.unreachable and not self.containers_left


@dataclass(frozen=True)
class LogLine:
    task: str
    text: str  # without its newline


@dataclass(frozen=True)
class TaskMetrics:
    """What the report reads from one task's output: (epoch seconds, step) per step line, and
    per metric (loss, accuracy, ...) its (epoch seconds, value) series."""

    task: str
    steps: tuple[tuple[float, float], ...]
    series: Mapping[str, tuple[tuple[float, float], ...]]


@dataclass(frozen=True)
class Metrics:
    tasks: tuple[TaskMetrics, ...]
    result: Mapping[str, Metric]  # the final evaluation's numbers

    def task(self, name: str) -> TaskMetrics:
        """The task `job:index`'s series; KeyError if the run has none of that name."""
        for t in self.tasks:
            if t.task == name:
                return t
        raise KeyError(name)


def metrics_of(result: Mapping[str, Any] | None) -> dict[str, Metric]:
    return {name: Metric(m["value"], m.get("step"), m.get("task", "")) for name, m in (result or {}).items()}
