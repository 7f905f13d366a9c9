"""The records that travel inside the protocol's requests and answers (`protocol.py`): a task as
launched and as its host knows it, the rules its monitor applies (restart, idle, progress), what
it used, and what a port or a probe was found to be. Stdlib only, shipped to the hosts.
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Mapping, Optional

from .records import Wire, field, record
from .states import TaskState


@record
class Mark(Wire):
    """An output line that shows progress, and when it was written (to within a second)."""

    time: float
    text: str


@record
class ProgressRule(Wire):
    """Which output lines show progress (a regex), and how far back the controller looks."""

    pattern: str
    window: float = 60.0
    buckets: int = 16  # of each kind of line, one mark per window/buckets seconds (and the newest few)


@record
class Attempt(Wire):
    """One earlier run of a task that was restarted: when it started and ended, and how."""

    started_at: float
    ended_at: float
    end: str  # "exited with code 1", as `TaskInfo.earlier_ends` says it


@record
class Usage(Wire):
    """What a task's process tree used, as its monitor last sampled it (`usage.py`). CPU percent
    is over the interval before `sampled_at`, 100 per busy core; GPU values only with GPUs."""

    sampled_at: float
    cpu_percent: float
    rss_bytes: int
    gpu_util_percent: Optional[float] = None
    gpu_memory_bytes: Optional[int] = None


@record
class TaskInfo(Wire):
    """The truth about one task on its host: files written by its monitor, checked against /proc."""

    ENUMS: ClassVar[Mapping[str, Any]] = {"state": TaskState}
    NESTED: ClassVar[Mapping[str, Any]] = {
        "marks": ("list", Mark),
        "attempts": ("list", Attempt),
        "usage": ("one", Usage),
        "usage_history": ("list", Usage),
    }

    task: str
    state: TaskState = TaskState.PENDING
    pid: Optional[int] = None
    pgid: Optional[int] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    error: Optional[str] = None
    listening: bool = False
    last_line: str = ""
    uptime: Optional[float] = None
    stop_reason: Optional[str] = None  # why the host itself stopped it (lease, idle rule)
    restarts: int = 0
    earlier_ends: List[str] = field(default_factory=list)  # how each run before a restart ended
    marks: List[Mark] = field(default_factory=list)  # recent progress lines, when asked for
    attempts: List[Attempt] = field(default_factory=list)  # the earlier runs whose times were recorded
    unrecorded: bool = False  # its end is known to its monitor, which waits for the disk to take it
    usage: Optional[Usage] = None  # while it runs: its latest CPU, memory and GPU sample
    usage_history: List[Usage] = field(default_factory=list)  # earlier samples, when asked for
    cpu_seconds: Optional[float] = None  # CPU time of every run of it so far, as its monitor counted
    output_at: Optional[float] = None  # when it last wrote to its log (its mtime), by its host's clock
    output_lines: Optional[int] = None  # lines in its log, when asked for (`StatusRequest.count_lines`)


@record
class PortInfo(Wire):
    """Whether something listens on a port of a host, and which processes hold it."""

    listening: bool
    pids: List[int] = field(default_factory=list)
    command: str = ""


@record
class FileEntry(Wire):
    """One file of a synced workdir: content hash, size and permission bits."""

    sha: str
    size: int
    mode: int


@record
class ProbeResult(Wire):
    """A TCP connect from a host to one target. `error`: refused | timeout | unresolvable | unreachable."""

    ok: bool
    error: Optional[str] = None
    address: Optional[str] = None
    local: bool = False
    detail: Optional[str] = None


@record
class IdleRule(Wire):
    """When a task that never ends by itself stops on its own host (`supervisor.guard`)."""

    port: int
    timeout: float
    watch: Dict[str, str]  # decisive task -> its host:port
    startup_timeout: float


@record
class RestartRule(Wire):
    """When a task that ended is started again (`monitor._restart_wanted`)."""

    policy: str  # never | on-failure | exit-code
    max_restarts: int
    backoff: float


@record
class ContainerLaunch(Wire):
    """The container a task runs in (`containers.py`): the cluster file's `container:`."""

    image: str
    runtime: str = "auto"  # podman | docker | apptainer | auto: the first the host has
    mounts: List[str] = field(default_factory=list)  # host:container[:options]
    options: List[str] = field(default_factory=list)
    python: str = "python3"
    pull_timeout: float = 600.0  # a pull, or a tarball's load, that takes longer fails preflight


@record
class ClaimAsk(Wire):
    """What a task claims on its host: GPUs by index, a number of cores out of the first
    `cpu_limit` the host runs tasks on, and one of `task_limit` task slots (0: not counted)."""

    gpus: List[int] = field(default_factory=list)
    cpus: int = 0
    cpu_limit: int = 0
    task_limit: int = 0


@record
class Holding(Wire):
    """One resource held on this host, by whom (as the holder's note says; `""` when its note is
    gone: held, but nobody says by what)."""

    resource: str
    user: str = ""
    run_id: str = ""
    task: str = ""
    pid: int = 0


@record
class TaskLaunch(Wire):
    """Everything the supervisor needs to start one task and stop it later."""

    NESTED: ClassVar[Mapping[str, Any]] = {
        "idle": ("one", IdleRule),
        "restart": ("one", RestartRule),
        "container": ("one", ContainerLaunch),
        "claims": ("one", ClaimAsk),
    }

    task: str
    command: str
    env: Dict[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    grace: float = 10.0
    store: str = ""
    idle: Optional[IdleRule] = None
    restart: Optional[RestartRule] = None
    path_first: Optional[str] = None  # put first on PATH, so `python` in a command is the host's python
    cpus: Optional[List[int]] = None  # the cores the task may run on (its placement); None: any
    container: Optional[ContainerLaunch] = None  # None: the task runs bare on its host
    claims: Optional[ClaimAsk] = None  # a pool's run: what its monitor claims before it starts (`claims.py`)
