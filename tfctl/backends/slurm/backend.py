"""A run on Slurm from start to end: the allocation it runs in, its tasks as job steps, and the
allocation's end as part of the run's end.

The run record keeps the allocation (`SlurmAllocation`): one tfctl asked for is ended with the
run; one tfctl found itself inside (`SLURM_JOB_ID`) is left to its owner.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Mapping, Sequence

from tfctl.backends.base import Acquired, BackendReport, Progress, PruneTarget
from tfctl.backends.slurm.allocation import (
    JobState,
    Runner,
    SlurmError,
    batch_host,
    cancel,
    current_job,
    describe,
    job_state,
    recorded_state,
    run_slurm,
    submit,
    time_left,
    wait_ended,
    wait_running,
)
from tfctl.backends.slurm.batch import (
    CONTROLLER_ENV,
    Say,
    allocation_number,
    follow,
    submit_controller,
    submit_successor,
)
from tfctl.backends.slurm.placement import (
    components,
    node_count,
    nodes_by_job,
    place,
    settings_of,
    step_options,
    task_count,
)
from tfctl.backends.slurm.pyxis import (
    IMPORT_FIX,
    NodeContainer,
    StepsRunner,
    choose,
    first_look,
    import_images,
    node_container,
    without_containers,
)
from tfctl.backends.slurm.sacct import slurm_accounting
from tfctl.backends.slurm.transport import SlurmStepSpec, relay_step, step_argv
from tfctl.config.home import tfctl_home
from tfctl.config.model import ClusterConfig
from tfctl.engine.clock import REAL_CLOCK, Clock
from tfctl.engine.resubmission import AllocationOver
from tfctl.errors import UsageError
from tfctl.runs.record import HostSpec, RunRecord, TaskSpec
from tfctl.supervisor.records import Wire, field, record
from tfctl.transport.specs import LocalSpec

if TYPE_CHECKING:
    from tfctl.cluster.agent import HostAgent

# Slurm looks at time limits about twice a minute: a job is signalled up to this much before its
# `signal_before`, and ended up to this much after its limit.
LIMIT_SLACK = 60.0
CONTINUES = ("TIMEOUT", "PREEMPTED")  # the ends a run goes on after, in a new allocation
NODES_LABEL = "slurm nodes"  # where a Slurm run's files are pruned from: this machine, which shares them


@record
class SlurmAllocation(Wire):
    """The run's allocation: its job id, whether tfctl asked for it (and so ends it), what each
    task's job step asks Slurm for beyond one task (its component, GPUs and cores), how long before
    its time limit Slurm signals the tasks (0: it does not), and of a heterogeneous job, the
    component of each node (empty: one component), whether the controller runs inside it, and
    the container each node's steps run in where pyxis holds the tasks' containers (`pyxis.py`)."""

    NESTED: ClassVar[Mapping[str, Any]] = {"containers": ("dict", NodeContainer)}

    job_id: str
    owned: bool
    steps: Dict[str, List[str]] = field(default_factory=dict)
    signal_before: int = 0
    groups: Dict[str, int] = field(default_factory=dict)
    inside: bool = False  # the run's controller runs in this allocation's batch script (tfctl's own)
    successor: str = ""  # the batch job queued to take the run up if this allocation ends under it
    handed_over: str = ""  # why the allocation ended (TIMEOUT, PREEMPTED), as its controller saw at its end
    containers: Dict[str, NodeContainer] = field(default_factory=dict)  # node -> its container (pyxis)


def allocation_of(record: RunRecord) -> SlurmAllocation:
    return SlurmAllocation.from_wire(record.backend_state or {})


def _report(record: RunRecord, state: JobState, run: Runner) -> BackendReport:
    """The allocation's state, and what Slurm's accounting recorded of every allocation of the run."""
    allocation = allocation_of(record)
    figures = slurm_accounting(job_ids(record), run, components=len(set(allocation.groups.values())) or 1)
    fields = {**allocation.to_wire(), "state": state.state, "reason": state.reason, "accounting": figures}
    return BackendReport(LABEL % allocation.job_id, describe(state), state.ended, fields)


LABEL = "slurm job %s"


def job_ids(record: RunRecord) -> list[str]:
    """The run's allocations: each one it outlived (a resubmitted run), then its own."""
    ended = [end.label.rpartition(" ")[2] for end in record.allocations if end.label.startswith(LABEL % "")]
    return [*ended, allocation_of(record).job_id]


def _shown_nodes(state: JobState) -> str:
    """`tfh0, tfh1`; of a heterogeneous job, each component's."""
    if len(state.components) == 1:
        return ", ".join(state.nodes)
    return "; ".join(f"component {i}: {', '.join(nodes)}" for i, nodes in enumerate(state.components))


def _het_group(groups: Mapping[str, int], node: str) -> list[str]:
    """A step's component of the heterogeneous job, for a node of one."""
    return [f"--het-group={groups[node]}"] if node in groups else []


def _word(state: JobState) -> str:
    """The state's word: `CANCELLED` of `CANCELLED by 0`; "" once Slurm forgot the job."""
    return (state.state.split() or [""])[0]


class StepLauncher:
    """Starts each task's monitor as a job step of its own on its node.

    The step lasts as long as its monitor, so Slurm accounts for the task and ends it with the
    job. Its `srun` runs here, detached: a step ends when its srun does, so srun must outlive the
    `up` that started it (and is a child of nobody a terminal's Ctrl-C reaches).
    """

    def __init__(self, allocation: SlurmAllocation) -> None:
        self.allocation = allocation

    def argv(self, host: str, agent: HostAgent, run_id: str, task: TaskSpec) -> list[str]:
        """The task's step: its monitor, in the node's container where pyxis holds one (then
        `agent.python` is the image's)."""
        box = self.allocation.containers.get(host)
        extra = (*self.allocation.steps.get(task.name, []), *(box.options if box else ()))
        argv = step_argv(self.allocation.job_id, host, name=f"{run_id}:{task.name}", extra=extra)
        return [*argv, agent.python, "-I", "-S", agent.artifact_path(), "monitor", agent.root, run_id, task.name]

    def launch(self, host: str, agent: HostAgent, run_id: str, tasks: Sequence[TaskSpec]) -> None:
        for task in tasks:
            subprocess.Popen(
                self.argv(host, agent, run_id, task),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )


class SlurmBackend:
    """Tasks on the nodes of one allocation per run, each task a job step."""

    name = "slurm"
    host_word = "node"
    waiting_for: str | None = "Slurm"
    places_devices = True  # each task's step asks Slurm for its GPUs and cores

    def __init__(
        self, run: Runner = run_slurm, import_images: StepsRunner = import_images, clock: Clock = REAL_CLOCK
    ) -> None:
        self.run = run
        self._import_images = import_images  # injected, as `run` is
        self.clock = clock  # what its waits for Slurm, and a run's supervision, wait on

    def stand_in(self, config: ClusterConfig, *, per_task: bool = False) -> tuple[ClusterConfig, str | None]:
        if per_task:
            return place(config, tuple(f"task{i}" for i in range(task_count(config)))), None
        parts = components(config)
        if len(parts) == 1:
            nodes = tuple(f"node{i}" for i in range(1, node_count(config) + 1))
            return place(
                config, nodes
            ), f"backend slurm: tasks go to the allocation's nodes, shown here as {', '.join(nodes)}"
        groups, first = [], 1
        for part in parts:
            groups.append(tuple(f"node{i}" for i in range(first, first + part.nodes)))
            first += part.nodes
        shown = "".join(
            f"\n  component {i}: {part.describe()}: {', '.join(nodes)}"
            for i, (part, nodes) in enumerate(zip(parts, groups))
        )
        note = f"backend slurm: one heterogeneous job of {len(parts)} components, its nodes shown here as{shown}"
        return place(config, nodes_by_job(config, groups)), note

    def check_refusal(self, config: ClusterConfig) -> UsageError | None:
        return UsageError(
            "`check` needs the hosts, and on Slurm they are known only once the allocation is granted",
            hint="`tfctl up --dry-run` shows how tasks are placed; `tfctl up` checks the nodes before starting any",
        )

    def spares(self, config: ClusterConfig) -> tuple[str, ...]:
        return ()  # the allocation's nodes are all in use; `spares:` is refused (settings.check)

    def acquire(self, config: ClusterConfig, run_id: str, progress: Progress) -> Acquired:
        tasks = task_count(config)
        settings = settings_of(config)
        looked = first_look(config, settings.containers, self.run)  # a refusal comes before the queue
        job_id = current_job()
        inside = job_id is not None and os.environ.get(CONTROLLER_ENV) == job_id  # tfctl's own batch job
        owned = job_id is None or inside
        if job_id is None:
            job_id = submit(config, f"tfctl-{run_id}", self.run)
            progress("slurm", f"asked for {tasks} tasks: job {job_id}")
            progress("slurm", f"the run's controller runs here, on {socket.gethostname()} (`controller: login`)")
        elif inside:
            progress("slurm", f"the run's controller runs in job {job_id}, on {socket.gethostname()}")
        else:
            progress("slurm", f"inside allocation {job_id} (SLURM_JOB_ID): using its nodes")
        groups: dict[str, int] = {}
        try:
            state = wait_running(job_id, progress, self.run, self.clock)
            if len(components(config)) > 1 and owned:
                placed = place(config, nodes_by_job(config, state.components))
                groups = {
                    node: index for index in reversed(range(len(state.components))) for node in state.components[index]
                }
            else:  # one component; or the job tfctl runs inside, whatever its shape
                placed = place(config, state.nodes)
            progress("slurm", f"job {job_id} running on {_shown_nodes(state)}")
            boxes = self._containers(placed, looked, run_id, job_id, groups, progress)
        except BaseException:
            if owned:
                cancel(job_id, self.run, self.clock)
            raise
        if boxes:  # the nodes' steps run in them: the tasks run bare there, with the image's Python
            placed = without_containers(placed)
        options = step_options(config) if owned else step_options(config, heterogeneous=False)
        successor = ""
        if inside and allocation_number() <= settings.resubmit:  # (it dies with this allocation: see batch)
            successor = submit_successor(config, run_id, job_id, self.run).job_id
            progress("slurm", f"job {successor} takes the run up if job {job_id} ends under it")
        allocation = SlurmAllocation(
            job_id, owned, options, settings.signal_before or 0, groups, inside, successor, containers=boxes
        )
        return Acquired(placed, allocation.to_wire(), settings.resubmit if owned else 0)

    def _containers(
        self,
        placed: ClusterConfig,
        looked: str | None,
        run_id: str,
        job_id: str,
        groups: Mapping[str, int],
        progress: Progress,
    ) -> dict[str, NodeContainer]:
        """Where pyxis holds the tasks' containers (`slurm.containers`, and what `first_look`
        found): node -> its container, its image imported there by a first step; empty: tasks
        run bare, or in the runtime each step starts."""
        choice = choose(placed, settings_of(placed).containers, looked)
        if choice.why:
            progress("slurm", f"containers: the node's runtime in each step (not pyxis: {choice.why})")
        if not choice.nodes:
            return {}
        root, workdir = str(tfctl_home()), str(placed.workdir or placed.path.resolve().parent)  # as the tasks run
        boxes = {node: node_container(run_id, box, root, workdir) for node, box in choice.nodes.items()}
        images = ", ".join(sorted({box.image for box in choice.nodes.values()}))
        progress("slurm", f"containers: pyxis; importing {images} on {', '.join(boxes)}")
        steps = {}
        for node, box in boxes.items():
            extra = (*_het_group(groups, node), "--overlap", *box.options)
            steps[node] = [*step_argv(job_id, node, name=f"{run_id}:import", extra=extra), "true"]
        began = time.monotonic()
        timeout = max(box.pull_timeout for box in choice.nodes.values())

        def waiting(seconds: float) -> None:
            progress("slurm", f"importing {images} ({seconds:.0f}s; imports end at container.pull_timeout)")

        failed = self._import_images(steps, timeout, waiting)
        if failed:
            lines = "\n".join(f"  {node}: {why}" for node, why in sorted(failed.items()))
            raise SlurmError(f"pyxis could not start the tasks' containers:\n{lines}", hint=IMPORT_FIX)
        progress("slurm", f"containers ready in {time.monotonic() - began:.1f}s")
        return boxes

    def host_spec(self, config: ClusterConfig, host: str, state: Mapping[str, Any] | None) -> HostSpec:
        """The node, reached by job steps; where pyxis holds its container, every step runs in it,
        with the image's Python."""
        allocation = SlurmAllocation.from_wire(state) if state else SlurmAllocation("(job)", False)
        box = allocation.containers.get(host)
        spec = SlurmStepSpec(
            allocation.job_id, allocation.groups.get(host), config.python_for(host), box.options if box else []
        )
        return HostSpec(host, box.python if box else config.python_for(host), str(tfctl_home()), spec)

    def monitor_launcher(self, record: RunRecord) -> StepLauncher:
        return StepLauncher(allocation_of(record))

    def allocation_end(self, record: RunRecord) -> str | None:
        """Slurm ended the allocation under the run (time limit, preemption, scancel)."""
        job_id = allocation_of(record).job_id
        state = job_state(job_id, self.run)
        return f"Slurm ended job {job_id}: {describe(state)}" if state.ended else None

    def is_over(self, record: RunRecord) -> bool:
        """Its allocation ended, and no successor is queued to take the run up."""
        allocation = allocation_of(record)
        return all(job_state(job, self.run).ended for job in (allocation.job_id, allocation.successor) if job)

    def why_over(self, record: RunRecord, progress: Progress) -> AllocationOver | None:
        allocation = allocation_of(record)
        job_id = allocation.job_id
        if allocation.handed_over:  # its controller said why as it ended (Slurm may have forgotten since)
            return AllocationOver(allocation.handed_over, allocation.owned)
        state = job_state(job_id, self.run)
        left = 0.0
        if _word(state) == "COMPLETING":  # ending (its steps killed): how, Slurm says once it ended
            progress("slurm", f"job {job_id} is ending; waiting for Slurm to say why")
        elif not state.ended:  # the tasks ended first: by the signal before the limit, or by themselves
            known = time_left(job_id, self.run)
            if not allocation.signal_before or known is None or known > allocation.signal_before + LIMIT_SLACK:
                return None
            left = known
            progress("slurm", f"job {job_id}: the tasks ended {left:.0f}s before its time limit; waiting for its end")
        if not state.ended:
            state = wait_ended(job_id, left + 2 * LIMIT_SLACK, self.run, self.clock)
            if not state.ended:
                return None
        progress("slurm", f"job {job_id} ended: {describe(state)}")
        return AllocationOver(_word(state) or "GONE", allocation.owned and _word(state) in CONTINUES)

    def release(self, record: RunRecord) -> BackendReport | None:
        allocation = allocation_of(record)
        if not allocation.owned:
            return None
        if allocation.successor:  # first: the allocation's end would start it
            cancel(allocation.successor, self.run, self.clock)
        if allocation.inside and current_job() == allocation.job_id:  # the controller: its script's end releases it
            return _report(record, job_state(allocation.job_id, self.run), self.run)
        return _report(record, cancel(allocation.job_id, self.run, self.clock), self.run)

    def hand_over(self, record: RunRecord) -> Mapping[str, Any] | None:
        """The controller in the allocation, told to end (SIGTERM): while Slurm ends the
        allocation (its state `COMPLETING`), a queued successor takes the run up and decides
        whether it goes on: the backend state to record, with why the allocation ends where Slurm
        says it yet (a time limit, a preemption; a cancel is left to the successor to read).
        None: no successor, or a SIGTERM not of Slurm's (a `kill`): stop the run as before."""
        allocation = allocation_of(record)
        if not (allocation.inside and allocation.successor and current_job() == allocation.job_id):
            return None
        state, reason, preempted = recorded_state(allocation.job_id, self.run)
        if state == "RUNNING" and not preempted:
            return None
        why = "TIMEOUT" if reason == "TimeLimit" else "PREEMPTED" if preempted else state if state in CONTINUES else ""
        return allocation.replace(handed_over=why).to_wire()

    def run_elsewhere(
        self, config: ClusterConfig, detach: bool, out: Say, err: Say, abandoned: Say, resume: str | None = None
    ) -> int | None:
        """With `slurm: {controller: allocation}`, outside any allocation: the run's controller
        runs in the batch script of its allocation; this `up` submits it and relays its output."""
        if settings_of(config).controller != "allocation" or current_job() is not None:
            return None
        job = submit_controller(config, resume, self.run)
        err(f"submitted slurm job {job.job_id}; the run's controller runs in it (its output: {job.err})")
        return follow(job, detach, out, err, self.run, self.clock, abandoned)

    def door_relay(self, record: RunRecord, door: Path) -> list[str] | None:
        """A controller in the allocation's batch script, asked from outside the allocation: a
        step beside it (`--overlap`) on the batch host relays to its door there."""
        allocation = allocation_of(record)
        if not allocation.inside or current_job() == allocation.job_id:
            return None
        host = batch_host(allocation.job_id, self.run)
        if host is None:
            return None
        python = next((_own_python(h) for h in record.hosts if h.name == host), None)
        return relay_step(allocation.job_id, host, allocation.groups.get(host), python, str(door))

    def report(self, record: RunRecord) -> BackendReport:
        return _report(record, job_state(allocation_of(record).job_id, self.run), self.run)

    def prune_targets(self, record: RunRecord) -> tuple[PruneTarget, ...]:
        """This machine, which shares the nodes' files (their allocation is over, and srun cannot
        reach them any more)."""
        if not record.hosts:
            return ()
        node = record.hosts[0]
        return (PruneTarget(HostSpec(NODES_LABEL, _own_python(node), node.root, LocalSpec()), every_host=True),)


def _own_python(node: HostSpec) -> str | None:
    """The cluster file's interpreter for the node, outside any container of its (a path in the
    image means nothing here): what runs plumbing on it, and the supervisor here that prunes."""
    return node.transport.python if isinstance(node.transport, SlurmStepSpec) else node.python


BACKEND = SlurmBackend()
