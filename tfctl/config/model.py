"""The cluster model: the frozen dataclasses every part of tfctl reads, and the names they allow.

`loader.py` builds a `ClusterConfig` from a cluster file; nothing downstream re-reads YAML, so
these classes are all a run needs to know about the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from tfctl.config.devices import DeviceAsk
from tfctl.config.sweep import SweepSpec, TrialOf
from tfctl.config.tracking import TrackingSettings

# Order matters: it is the order jobs appear in TF_CONFIG, tables and start phases.
JOB_NAMES = ("chief", "ps", "worker", "evaluator")
# The `{placeholders}` a command may use; `tf/cluster.py` fills in every one.
PLACEHOLDERS = (
    "job_name",
    "task_index",
    "ps_hosts",
    "worker_hosts",
    "chief_hosts",
    "evaluator_hosts",
    "python",
    "run_id",
    "logdir",
)
# The placeholders an `env` value may use: a command's, and the task's GPU indices.
ENV_PLACEHOLDERS = (*PLACEHOLDERS, "gpus")
# The placeholders `logdir` itself may use.
LOGDIR_PLACEHOLDERS = ("run_id",)
SUCCESS_POLICIES = ("chief", "all_workers")
START_ORDERS = ("together", "ordered")
PLACEMENTS = ("together", "ps_apart")  # how a pool's hosts are picked (`engine/placement.py`)
RESTART_POLICIES = ("never", "on-failure", "exit-code")  # as Kubeflow's TFJob
STALL_ACTIONS = ("warn", "fail", "restart")  # what a run's controller does with a stalled task
DEFAULT_MAX_RESTARTS = 3
DEFAULT_BACKOFF = 10.0
# Never worth copying to a host: version control, caches, virtualenvs, editor and OS litter.
DEFAULT_EXCLUDE = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    "*.pyc",
    ".venv",
    "venv",
    ".mypy_cache",
    ".pytest_cache",
    ".ipynb_checkpoints",
    ".DS_Store",
)
DEFAULT_GRACE_PERIOD = 10.0
DEFAULT_STARTUP_TIMEOUT = 120.0
DEFAULT_PULL_TIMEOUT = 600.0  # a pull of a multi-GB image (NVIDIA's) over an ordinary link
DEFAULT_LEASE_TIMEOUT = 60.0
DEFAULT_IDLE_PS_TIMEOUT = 120.0
DEFAULT_HOST_TIMEOUT = 120.0
DEFAULT_STALL_TIMEOUT = 120.0
DEFAULT_PROGRESS_WINDOW = 60.0
IMAGE_PULL_POLICIES = ("Always", "IfNotPresent", "Never")  # as Kubernetes spells them
CONTAINER_RUNTIMES = ("auto", "podman", "docker", "apptainer")


# The port of a task written without one: its host's supervisor picks a free one at `up`.
CHOSEN_AT_START = 0


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets: `[::1]:2222`; a port still to be chosen
    shows as such (`up --dry-run` plans before any host is asked)."""
    shown = "<chosen at start>" if port == CHOSEN_AT_START else str(port)
    return f"[{host}]:{shown}" if ":" in host else f"{host}:{shown}"


def frozen_env(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """A read-only copy, so a frozen dataclass's env cannot change under a running plan."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Address:
    """A task's `host:port`, exactly as TF tasks use it to reach each other (port
    CHOSEN_AT_START until `up` has its host pick one)."""

    host: str
    port: int

    def __str__(self) -> str:
        return host_port(self.host, self.port)


@dataclass(frozen=True)
class RestartPolicy:
    """When a task of a job that ended is started again on its host, with the same TF_CONFIG."""

    policy: str  # RESTART_POLICIES
    max_restarts: int = DEFAULT_MAX_RESTARTS
    backoff: float = DEFAULT_BACKOFF


@dataclass(frozen=True)
class ProgressSettings:
    """How `status` reads training progress from task output (see `tf/progress.py`)."""

    regex: str | None = None  # replaces the built-in shapes; has a (?P<step>...) or (?P<rate>...) group
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # no step for this long: `stalled`
    window: float = DEFAULT_PROGRESS_WINDOW  # steps/s is measured over this many seconds
    on_stall: str = "warn"  # STALL_ACTIONS


@dataclass(frozen=True)
class KubernetesSettings:
    """The pods of `tfctl export` (tfjob, jobset, indexed-job); `up` ignores them, so `image` is
    only required there."""

    image: str | None = None
    namespace: str = "default"
    image_pull_policy: str | None = None  # IMAGE_PULL_POLICIES
    service_account: str | None = None
    workdir: str | None = None  # the container's working directory


@dataclass(frozen=True)
class ContainerSettings:
    """The image a task runs in, and how (`tfctl/supervisor/containers.py` runs it)."""

    image: str
    runtime: str = "auto"  # CONTAINER_RUNTIMES
    mounts: tuple[str, ...] = ()  # host:container[:options], beyond the workdir and the run's folder
    options: tuple[str, ...] = ()  # more runtime arguments, as they are
    python: str | None = None  # `{python}`; None: `python3` on the image's PATH
    pull_timeout: float = DEFAULT_PULL_TIMEOUT  # for a pull or a tarball's load, apart from startup_timeout


@dataclass(frozen=True)
class Job:
    """One TF job; task index = position in `addresses`."""

    name: str
    addresses: tuple[Address, ...]
    command: str | None = None
    env: Mapping[str, str] = field(default_factory=frozen_env)
    restart: RestartPolicy | None = None
    gpus: int | None = None  # GPUs per task; None: the task sees whatever its host has
    cpus: int | None = None  # CPU cores per task; None (or 0): no affinity set
    count: int | None = None  # a backend that places tasks itself: how many; `addresses` come from it
    port: int | None = None  # and the port its tasks listen on (another if a host gets two); None: chosen
    container: ContainerSettings | None = None  # None: the top-level one, if any
    own: object | None = None  # the job's own section of its backend (as its name), as that backend parsed it


@dataclass(frozen=True)
class SSHSettings:
    """How to reach a remote host; unset fields fall back to ~/.ssh/config, then ssh's defaults."""

    destination: str | None = None  # SSH target when it differs from the cluster address
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    config: str | None = None  # ssh config file (default ~/.ssh/config)
    connect_timeout: float | None = None
    keepalive: float | None = None


@dataclass(frozen=True)
class HostConfig:
    """Per-host overrides from the `hosts:` section, keyed by the host name the jobs use."""

    name: str
    ssh: SSHSettings = field(default_factory=SSHSettings)
    python: str | None = None
    local: bool | None = None  # None: local exactly when the name is localhost / 127.x / ::1


@dataclass(frozen=True)
class TaskClaim:
    """What a task placed on a pool claims on its host at start (`supervisor/claims.py`): these
    GPUs, `cpus` of the host's first `cpu_limit` cores, one of `task_limit` slots (0: not counted)."""

    gpus: tuple[int, ...] = ()
    cpus: int = 0
    cpu_limit: int = 0
    task_limit: int = 0


@dataclass(frozen=True)
class ClusterConfig:
    """A validated cluster file. `jobs` keeps JOB_NAMES order and holds only the jobs present."""

    name: str
    path: Path
    jobs: Mapping[str, Job]
    command: str | None = None
    python: str | None = None
    workdir: Path | None = None
    env: Mapping[str, str] = field(default_factory=frozen_env)
    grace_period: float = DEFAULT_GRACE_PERIOD
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    success_policy: str = "chief"
    ssh: SSHSettings = field(default_factory=SSHSettings)
    hosts: Mapping[str, HostConfig] = field(default_factory=lambda: MappingProxyType({}))
    sync: bool = True
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    hang_timeout: float | None = None  # None: the startup timeout
    fail_on_ps_exit: bool = True
    # An attached run's tasks stop this long after their controller; 0: never.
    lease_timeout: float = DEFAULT_LEASE_TIMEOUT
    # Tasks that never end by themselves (ps) stop this long after their job is over; 0: never.
    idle_ps_timeout: float = DEFAULT_IDLE_PS_TIMEOUT
    # A host that answers nothing for this long fails the run.
    host_timeout: float = DEFAULT_HOST_TIMEOUT
    progress: ProgressSettings = field(default_factory=ProgressSettings)
    # What a run's result is read from: metric name -> regex (`tf/results.py`); empty: the built-in lines.
    metrics: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # as put in: `params.py`
    param_texts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False)
    sweep: SweepSpec | None = None  # the trials `tfctl sweep` runs; `up` runs the `params:` as they are
    trial: TrialOf | None = field(default=None, compare=False)  # set by `tfctl sweep`, never by the file
    start_order: str = "together"  # START_ORDERS
    pool: str | None = None  # as written: a pool's name or a pool file's path (`config/pool.py`)
    placement: str = "together"  # PLACEMENTS: how the pool's hosts are picked
    claims: Mapping[str, TaskClaim] = field(default_factory=lambda: MappingProxyType({}))  # task -> its, once placed
    # Where the tasks write TensorBoard summaries (relative: to each task's workdir); may hold {run_id}.
    logdir: str | None = None
    # Shell commands run once per workdir (a shared one: once), in the run's workdir there, before any task starts.
    setup: tuple[str, ...] = ()
    # Shell commands run on this machine on the run's events (`controller/live/notify.py`).
    notify: tuple[str, ...] = ()
    tracking: TrackingSettings | None = None  # the experiment tracker its runs log into (`tfctl/tracking/`)
    backend: str = "ssh"  # which backend runs the tasks (`tfctl.registry.backends`)
    backend_settings: Any = None  # that backend's own section, as its `settings` module read it
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    container: ContainerSettings | None = None  # every task's image, unless its job names its own
    # The text it was read from: what a run keeps, so a resubmission hours later is the run that
    # started, whatever became of the file.
    source: str = field(default="", repr=False, compare=False)

    def command_for(self, job: str) -> str:
        """The job's own command, else the cluster command (validation guarantees one exists)."""
        own = self.jobs[job].command
        return own if own is not None else self.command or ""

    def container_for(self, job: str) -> ContainerSettings | None:
        """The job's own container, else the cluster's; None: the job's tasks run bare."""
        return self.jobs[job].container or self.container

    def python_for(self, host: str) -> str | None:
        """The host's own `python` (under `hosts:`), else the cluster's."""
        own = self.hosts.get(host)
        return own.python if own is not None and own.python else self.python

    def env_for(self, job: str) -> dict[str, str]:
        """Cluster env overlaid by the job's env."""
        return {**self.env, **self.jobs[job].env}

    def logdir_for(self, run_id: str) -> str | None:
        """`logdir` with `{run_id}` filled in (validation allows no other placeholder)."""
        return None if self.logdir is None else self.logdir.format(run_id=run_id)

    def device_asks(self) -> list[DeviceAsk]:
        """What every task asks its host for, in task order: the order devices are handed out."""
        return [
            DeviceAsk(f"{name}:{index}", address.host, self.jobs[name].gpus, self.jobs[name].cpus)
            for name, index, address in self.tasks()
        ]

    def ports_to_choose(self) -> dict[str, int]:
        """host -> how many of its tasks have no port yet (only hosts with such tasks)."""
        counts: dict[str, int] = {}
        for _, _, a in self.tasks():
            if a.port == CHOSEN_AT_START:
                counts[a.host] = counts.get(a.host, 0) + 1
        return dict(sorted(counts.items()))

    def ports_written(self, host: str) -> list[int]:
        """The ports the file gives the host's tasks: chosen ones must avoid them."""
        return sorted({a.port for _, _, a in self.tasks() if a.host == host and a.port != CHOSEN_AT_START})

    def with_ports(self, chosen: Mapping[str, list[int]]) -> ClusterConfig:
        """The same cluster with each task that has no port given the next of its host's
        `chosen` ports, in task order: what TF_CONFIG and every placeholder then name."""
        left = {host: list(ports) for host, ports in chosen.items()}

        def filled(address: Address) -> Address:
            if address.port != CHOSEN_AT_START:
                return address
            return Address(address.host, left[address.host].pop(0))

        jobs = {n: replace(j, addresses=tuple(filled(a) for a in j.addresses)) for n, j in self.jobs.items()}
        return replace(self, jobs=MappingProxyType(jobs))

    def tasks(self) -> list[tuple[str, int, Address]]:
        """Every task as (job, index, address), in JOB_NAMES order."""
        return [(name, i, a) for name, job in self.jobs.items() for i, a in enumerate(job.addresses)]
