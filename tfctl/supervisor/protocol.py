"""Every message between the controller and a host supervisor, typed, in one place.

Both sides import this module: the supervisor (stdlib only, Python >= 3.8, shipped to hosts) and
the controller (`tfctl.cluster.agent`). A request is a frozen dataclass that names its verb, its
answer type and whether running it twice is harmless; on the wire it travels as one JSON line

    {"id": "<request id>", "verb": "start", "root": "~/.tfctl", "req": {...}}

and its answer as one JSON line `{"id": ..., "ok": {...}}` or `{"id": ..., "error": "..."}`.
A request that is not idempotent (`start`, `listen`) may reach a host twice when a connection
drops after it was sent; the supervisor then answers the replay from the first run's record.
`follow` answers with a stream of events instead (`stream.py`); task and run states are in
`states.py`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Generic, List, Mapping, Optional, Type, TypeVar

from .queue_records import QueueNote as QueueNote
from .records import Record, Wire, field, record
from .states import RunState as RunState  # re-exported: states travel in most answers
from .states import TaskState as TaskState
from .task_records import (
    Attempt as Attempt,
)
from .task_records import (
    ClaimAsk as ClaimAsk,
)
from .task_records import (
    ContainerLaunch as ContainerLaunch,
)
from .task_records import (
    FileEntry as FileEntry,
)
from .task_records import (
    Holding as Holding,
)
from .task_records import (
    IdleRule as IdleRule,
)
from .task_records import (  # re-exported: both sides read them as part of the protocol
    Mark as Mark,
)
from .task_records import (
    PortInfo as PortInfo,
)
from .task_records import (
    ProbeResult as ProbeResult,
)
from .task_records import (
    ProgressRule as ProgressRule,
)
from .task_records import (
    RestartRule as RestartRule,
)
from .task_records import (
    TaskInfo as TaskInfo,
)
from .task_records import (
    TaskLaunch as TaskLaunch,
)
from .task_records import (
    Usage as Usage,
)

PROTOCOL_VERSION = 2


# ---------------------------------------------------------------- requests and answers

A = TypeVar("A", bound=Wire)


class Request(Wire, Generic[A]):
    """Base of every request: its verb, the type of its answer, and whether a replay is harmless."""

    VERB: ClassVar[str]
    ANSWER: ClassVar[Type[Wire]]
    IDEMPOTENT: ClassVar[bool] = True


@record
class StartAnswer(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {"tasks": ("dict", TaskInfo)}

    tasks: Dict[str, TaskInfo]


@record
class StartRequest(Request[StartAnswer]):
    """Start each task under its own monitor; answered once each runs or has failed to."""

    VERB: ClassVar[str] = "start"
    ANSWER: ClassVar[Type[Wire]] = StartAnswer
    IDEMPOTENT: ClassVar[bool] = False
    NESTED: ClassVar[Mapping[str, Any]] = {"tasks": ("list", TaskLaunch)}

    run_id: str
    tasks: List[TaskLaunch]
    lease: float = 0.0  # seconds without renewal before the run's tasks here stop; 0: no lease
    spawn: bool = True  # False: only prepare; the controller's backend starts each monitor (`serve.main`)
    again: str = ""  # where this start sets aside what an earlier start of its tasks left here
    # (`allocation1`: the run's first allocation ended under it; `moved2`: its second move to a spare)


@record
class StatusAnswer(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {"tasks": ("dict", TaskInfo)}

    tasks: Dict[str, TaskInfo]
    time: float
    tails: Dict[str, List[str]] = field(default_factory=dict)  # when asked (`StatusRequest.tail`)
    disk: str = ""  # why the host's state directory refuses writes ("disk full under ~/.tfctl (...)")


@record
class StatusRequest(Request[StatusAnswer]):
    """Tasks of a run by name, each with the port it should listen on."""

    VERB: ClassVar[str] = "status"
    ANSWER: ClassVar[Type[Wire]] = StatusAnswer
    NESTED: ClassVar[Mapping[str, Any]] = {"progress": ("one", ProgressRule)}

    run_id: str
    tasks: Dict[str, int]
    renew_lease: bool = False  # only the run's own controller renews its lease
    progress: Optional[ProgressRule] = None  # also each task's recent progress lines
    tail: int = 0  # also the last `tail` output lines of each task, so diagnosis needs no second call
    wait_listening: float = 0.0  # answer once every task listens or has ended, or after this long
    usage_history: int = 0  # also each running task's last `usage_history` usage samples
    usage_points: int = 0  # also every task's usage over its whole life, thinned to this many samples
    count_lines: bool = False  # also each task's output lines so far (reads its whole log)


@record
class StopAnswer(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {"ports": ("dict", PortInfo), "tasks": ("dict", TaskInfo)}

    processes: int
    killed: int
    remaining: List[int]
    ports: Dict[str, PortInfo] = field(default_factory=dict)
    tasks: Dict[str, TaskInfo] = field(default_factory=dict)
    containers: int = 0  # the run's containers here when the stop began
    containers_left: List[str] = field(default_factory=list)  # the names of those still there after it
    ended: int = 0  # the run's tasks here that had already ended when the stop began


@record
class StopRequest(Request[StopAnswer]):
    """Stop the run's tasks on this host (all of them unless `tasks` names some) and prove it:
    SIGTERM, `grace` seconds, SIGKILL; then the state of `ports`."""

    VERB: ClassVar[str] = "stop"
    ANSWER: ClassVar[Type[Wire]] = StopAnswer

    run_id: str
    grace: float
    ports: List[int] = field(default_factory=list)
    tasks: Optional[List[str]] = None


@record
class RestartAnswer(Wire):
    asked: List[str]  # the tasks whose monitors will restart them (the others were not running)


@record
class RestartRequest(Request[RestartAnswer]):
    """Have the monitors of these running tasks stop them (SIGTERM, their grace, SIGKILL) and
    start them again as their restart policy would, counted against its `max_restarts`; `reason`
    is the end their restarts record (`progress.on_stall: restart`)."""

    VERB: ClassVar[str] = "restart"
    ANSWER: ClassVar[Type[Wire]] = RestartAnswer
    IDEMPOTENT: ClassVar[bool] = False  # a request sent again after a dropped connection restarts nothing twice

    run_id: str
    tasks: List[str]
    reason: str


@record
class ReapAnswer(Wire):
    processes: int
    killed: int
    remaining: List[int]
    runs: List[str]
    containers: int = 0  # containers of those runs removed


@record
class ReapRequest(Request[ReapAnswer]):
    """Stop every process started from `store` whose run is not in `live_runs`: orphans.
    `containers_only`: remove their containers alone (what `up` does before it starts)."""

    VERB: ClassVar[str] = "reap"
    ANSWER: ClassVar[Type[Wire]] = ReapAnswer

    live_runs: List[str]
    grace: float
    store: str
    containers_only: bool = False


@record
class PortsAnswer(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {"ports": ("dict", PortInfo)}

    ports: Dict[str, PortInfo]  # str(port) -> who listens


@record
class PortsRequest(Request[PortsAnswer]):
    VERB: ClassVar[str] = "ports"
    ANSWER: ClassVar[Type[Wire]] = PortsAnswer

    ports: List[int]


@record
class Gpu(Wire):
    """One GPU as nvidia-smi lists it; `index` is what CUDA_VISIBLE_DEVICES names."""

    index: int
    uuid: str


@record
class InfoAnswer(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {"gpus": ("list", Gpu)}

    hostname: str
    agent_python: str
    python: Optional[str] = None
    tensorflow: Optional[str] = None
    python_error: Optional[str] = None
    protocol: int = PROTOCOL_VERSION
    python_executable: Optional[str] = None  # the interpreter `python` resolved to (a venv's own path)
    cpus: List[int] = field(default_factory=list)  # the cores the supervisor, and so its tasks, may use
    gpus: List[Gpu] = field(default_factory=list)  # when asked for
    gpu_error: Optional[str] = None  # why none were found (no nvidia-smi, no driver), when asked for
    filesystem: str = ""  # the root's filesystem token: the same on hosts that share a home
    container: str = ""  # the runtime and image the tasks' Python was asked in; "": none
    container_error: Optional[str] = None  # why the tasks cannot run in their container here
    container_fetched: str = ""  # how the image came here in preflight (pulled, loaded); "": it was here
    missing_modules: List[str] = field(default_factory=list)  # of the request's `modules`, those its Python lacks


@record
class InfoRequest(Request[InfoAnswer]):
    """Who the host is, which Python and TensorFlow `python` (the tasks' interpreter) has, its
    cores and, with `gpus` (only where a task asks for some: nvidia-smi takes a while), its GPUs."""

    VERB: ClassVar[str] = "info"
    ANSWER: ClassVar[Type[Wire]] = InfoAnswer
    NESTED: ClassVar[Mapping[str, Any]] = {"container": ("one", ContainerLaunch)}

    python: Optional[str] = None
    gpus: bool = False
    container: Optional[ContainerLaunch] = None  # the tasks' Python is the image's
    modules: List[str] = field(default_factory=list)  # what the tasks' scripts import: does their Python have them?


@record
class ProbeAnswer(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {"results": ("dict", ProbeResult)}

    results: Dict[str, ProbeResult]


@record
class ProbeRequest(Request[ProbeAnswer]):
    """TCP connect from this host to each `host:port` target."""

    VERB: ClassVar[str] = "probe"
    ANSWER: ClassVar[Type[Wire]] = ProbeAnswer

    targets: List[str]
    timeout: float = 3.0


@record
class ListenAnswer(Wire):
    pid: int


@record
class ListenRequest(Request[ListenAnswer]):
    """Hold ports open for `seconds` (marked with `run_id`; `stop` ends it) to test the network."""

    VERB: ClassVar[str] = "listen"
    ANSWER: ClassVar[Type[Wire]] = ListenAnswer
    IDEMPOTENT: ClassVar[bool] = False

    run_id: str
    ports: List[int]
    seconds: float = 60.0
    store: str = ""


@record
class PickPortsAnswer(Wire):
    ports: List[int]  # free when picked, and held by a listener (pid) until the run's `stop`
    pid: int


@record
class PickPortsRequest(Request[PickPortsAnswer]):
    """Pick `count` free ports for a run's tasks written without one, outside the host's ephemeral
    range (where outgoing connections take theirs) and not in `avoid`, and hold each with a
    listener marked with `run_id` until a `stop` of the run with no tasks named (just before its
    tasks start) or the supervisor that picked them goes away, so nothing takes them meanwhile."""

    VERB: ClassVar[str] = "pick_ports"
    ANSWER: ClassVar[Type[Wire]] = PickPortsAnswer
    IDEMPOTENT: ClassVar[bool] = False

    run_id: str
    count: int
    avoid: List[int] = field(default_factory=list)
    seconds: float = 3600.0
    store: str = ""


@record
class TailAnswer(Wire):
    tails: Dict[str, List[str]]


@record
class TailRequest(Request[TailAnswer]):
    """The last `lines` lines of several tasks' output (for diagnosis)."""

    VERB: ClassVar[str] = "tail"
    ANSWER: ClassVar[Type[Wire]] = TailAnswer

    run_id: str
    tasks: List[str]
    lines: int = 200


@record
class SyncPlanAnswer(Wire):
    need: List[str]
    filesystem: str = ""  # the same token on hosts that share the cache's filesystem


@record
class SyncPlanRequest(Request[SyncPlanAnswer]):
    """Which files of the manifest the host's sync cache lacks or holds in another version."""

    VERB: ClassVar[str] = "sync_plan"
    ANSWER: ClassVar[Type[Wire]] = SyncPlanAnswer
    NESTED: ClassVar[Mapping[str, Any]] = {"files": ("dict", FileEntry)}

    cache: str
    files: Dict[str, FileEntry]


@record
class SyncApplyAnswer(Wire):
    copied: int
    files: int
    dest: str


@record
class SyncApplyRequest(Request[SyncApplyAnswer]):
    """Bring the cache up to the manifest with `blobs` (base64 by path), then copy it to `dest`."""

    VERB: ClassVar[str] = "sync_apply"
    ANSWER: ClassVar[Type[Wire]] = SyncApplyAnswer
    NESTED: ClassVar[Mapping[str, Any]] = {"files": ("dict", FileEntry)}

    cache: str
    dest: str
    files: Dict[str, FileEntry]
    blobs: Dict[str, str]


@record
class ResumeAnswer(Wire):
    found: bool  # whether the earlier run left a directory on this host
    dest: str
    linked: int = 0
    copied: int = 0


@record
class ResumeRequest(Request[ResumeAnswer]):
    """Bring the files of run `resume_from`'s directory into run `run_id`'s (`resume.py`)."""

    VERB: ClassVar[str] = "resume"
    ANSWER: ClassVar[Type[Wire]] = ResumeAnswer

    run_id: str
    resume_from: str


@record
class PruneAnswer(Wire):
    paths: Dict[str, List[str]]  # run -> its files here, removed (or, in a dry run, to remove)
    sizes: Dict[str, int]  # run -> bytes in them
    kept: Dict[str, str]  # run -> why none of its files were touched (something of it still runs)
    containers: Dict[str, List[str]] = field(default_factory=dict)  # run -> containers it left, removed


@record
class PruneRequest(Request[PruneAnswer]):
    """Remove the files of ended runs on this host: task state, logs and the run's directory."""

    VERB: ClassVar[str] = "prune"
    ANSWER: ClassVar[Type[Wire]] = PruneAnswer

    runs: List[str]
    dry_run: bool = False
    # Runs whose hosts share this very root and can no longer be reached (a scheduler's nodes once
    # their allocation is over), so nothing of them can run anywhere: remove every host's state here.
    every_host: bool = False


@record
class HoldingsAnswer(Wire):
    NESTED: ClassVar[Mapping[str, Any]] = {"held": ("list", Holding), "queues": ("list", QueueNote)}

    held: List[Holding]  # every resource claimed on this host, by any user's run
    gpu_pids: Dict[str, List[int]] = field(default_factory=dict)  # GPU index -> processes on it (nvidia-smi)
    gpu_error: str = ""  # why the GPUs' processes are unknown ("" when nvidia-smi answered or is absent)
    queues: List[QueueNote] = field(default_factory=list)  # every user's queue note here, fresh ones only
    you: str = ""  # the user the asker is on this host (its notes' `user`), which its own name may not be


@record
class HoldingsRequest(Request[HoldingsAnswer]):
    """What every user's runs hold on this host, and what runs on its GPUs: a pool's view of it.
    With `note`, this user's queue note is written first (then read back with the others'), so
    of two users' intents for one GPU each sees at least the one written before its own."""

    NESTED: ClassVar[Mapping[str, Any]] = {"note": ("one", QueueNote)}
    VERB: ClassVar[str] = "holdings"
    ANSWER: ClassVar[Type[Wire]] = HoldingsAnswer

    note: Optional[QueueNote] = None


VERBS: Dict[str, Type[Request[Any]]] = {
    cls.VERB: cls
    for cls in (
        StartRequest,
        StatusRequest,
        StopRequest,
        RestartRequest,
        ReapRequest,
        PortsRequest,
        InfoRequest,
        ProbeRequest,
        ListenRequest,
        PickPortsRequest,
        TailRequest,
        SyncPlanRequest,
        SyncApplyRequest,
        ResumeRequest,
        PruneRequest,
        HoldingsRequest,
    )
}


# ---------------------------------------------------------------- envelopes


@record
class Envelope(Record):
    """One request on the wire: its id (for replays), verb, the host's state root and the body."""

    id: str
    verb: str
    root: str
    body: Dict[str, Any]

    def to_wire(self) -> Dict[str, Any]:
        return {"id": self.id, "verb": self.verb, "root": self.root, "req": self.body}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Envelope:
        try:
            return cls(str(data["id"]), str(data["verb"]), str(data["root"]), dict(data["req"]))
        except (KeyError, TypeError) as e:
            raise ValueError("not a request envelope: %s" % e) from None

    def request(self) -> Request[Any]:
        """The typed request; ValueError for an unknown verb or a malformed body."""
        cls = VERBS.get(self.verb)
        if cls is None:
            raise ValueError("unknown verb %r" % self.verb)
        return cls.from_wire(self.body)


def envelope(request_id: str, root: str, request: Request[Any]) -> Envelope:
    return Envelope(request_id, request.VERB, root, request.to_wire())


def answer_to_wire(request_id: str, answer: Optional[Wire] = None, error: Optional[str] = None) -> Dict[str, Any]:
    if error is not None:
        return {"id": request_id, "error": error}
    assert answer is not None
    return {"id": request_id, "ok": answer.to_wire()}
