"""One run's tasks and the supervisors on its hosts: every query and command, on every host at once.

A façade over one `HostAgent` per host (connections open on first use, closed by `with`). It
answers with typed results and reports a host's failure as data, never hiding the other hosts.
Deciding what to do with those answers is `control.py`'s job; TensorFlow is `tf/`'s.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Mapping, Protocol, Sequence, TypeVar

from tfctl import trace
from tfctl.cluster.agent import HostAgent, open_agent
from tfctl.cluster.answers import HostInfo, ProbeFailure, StopReport, bin_dir, cut_line, error_text
from tfctl.cluster.group import GroupResult, fan_out
from tfctl.config.devices import HostDevices
from tfctl.engine.clock import Cancel
from tfctl.engine.leasing import Leases
from tfctl.engine.observed import TaskStatus
from tfctl.errors import HostError, StartupError
from tfctl.runs import transitions
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.runs.store import RunStore
from tfctl.runs.transitions import Transition
from tfctl.supervisor.protocol import (
    ContainerLaunch,
    IdleRule,
    InfoRequest,
    ListenRequest,
    PickPortsRequest,
    PortInfo,
    PortsRequest,
    ProbeRequest,
    ProgressRule,
    StartRequest,
    StatusAnswer,
    StatusRequest,
    StopAnswer,
    StopRequest,
    TailRequest,
    TaskInfo,
    TaskLaunch,
    TaskState,
)

Progress = Callable[[str, str], None]  # (task or host, message)
STATUS_TIMEOUT = 30.0  # a status request's own timeout on its host's conversation
LOST_HOST_PATIENCE = 10.0  # beyond the grace period: how long `stop` asks a host the run left by a move


@dataclass(frozen=True)
class Deadlines:
    """How long the run's requests wait for a host before it counts as not answering, so a
    frozen host holds nobody up: one look at every host (`status`: the others' answers are not
    held back by the slowest), a stop beyond its grace period (`stop`: proving the tasks gone),
    and a stop of a host the run already judged lost (`silent_stop`)."""

    status: float = 5.0
    stop: float = 30.0
    silent_stop: float = 2.0


CLOSE_PATIENCE = 5.0  # closing a frozen host's connection must not hold up the end of a command
T = TypeVar("T")


LAUNCH_PATIENCE = 15.0  # how long a monitor the backend launched may take to report its task running
STARTING_STATES = (TaskState.PENDING, TaskState.STARTING)


class MonitorLauncher(Protocol):
    """Starts prepared tasks' monitors itself (e.g. as a scheduler's job steps) instead of the
    host's supervisor forking them; each monitor then runs exactly as a forked one does."""

    def launch(self, host: str, agent: HostAgent, run_id: str, tasks: Sequence[TaskSpec]) -> None: ...


def quiet(_who: str, _msg: str) -> None:
    """Progress sink for callers that render nothing."""


class Cluster:
    """One run's tasks and the supervisors on its hosts. Constructing it does no I/O."""

    def __init__(
        self,
        record: RunRecord,
        agents: dict[str, HostAgent] | None = None,
        accept_new_host_keys: bool = False,
        holds_lease: bool = False,
        launcher: MonitorLauncher | None = None,
        deadlines: Deadlines = Deadlines(),
    ) -> None:
        """`holds_lease`: this is the run's attached controller, which starts its tasks with a
        lease (`record.lease_timeout`) and renews it on every host until closed. `launcher`:
        who starts the tasks' monitors when not each host's supervisor (the run's backend)."""
        self.record = record
        self.deadlines = deadlines
        self.launcher = launcher
        self.accept_new_host_keys = accept_new_host_keys
        self.agents = (
            agents
            if agents is not None
            else {h.name: open_agent(h, accept_new_host_keys) for h in record.hosts + record.lost_hosts}
        )
        self.holds_lease = holds_lease and record.lease_timeout > 0
        self._leases = Leases(record.lease_timeout)
        self._lease_lock = threading.Lock()
        self._record_lock = threading.Lock()  # one change of the record at a time (`apply`)
        self._closed = Cancel()  # its lease thread ends on it
        self._keeper: threading.Thread | None = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def apply(self, store: RunStore, transition: Transition) -> RunRecord | None:
        """`transition` carried out on the stored record (`transitions.apply`), which this copy
        then is, so the two never diverge whichever thread or process writes: the new record, or
        None where it was refused (this copy then the stored one as it stands) or the run is no
        longer recorded (a start that failed before it put anything on a host: this copy alone
        changes)."""
        with self._record_lock:
            stored = transitions.apply(store, self.record.run_id, transition)
            if stored is not None:
                self.record = stored
            elif store.exists(self.record.run_id):
                self.record = store.load(self.record.run_id)
            else:
                self.record = transition.on(self.record) or self.record
        return stored

    def rehost(self, record: RunRecord, launcher: MonitorLauncher | None) -> None:
        """The same run on other hosts (a new allocation, its tasks not started yet): whatever
        holds this cluster (the door, the log follower, `finish`) reaches the new hosts from now."""
        old = self.agents
        with self._lease_lock:
            self._leases = Leases(record.lease_timeout)  # the new hosts' leases are kept once their tasks start
        self.agents = {h.name: open_agent(h, self.accept_new_host_keys) for h in record.hosts + record.lost_hosts}
        self.record, self.launcher = record, launcher
        for agent in old.values():
            agent.close()

    def close(self) -> None:
        self._closed.set("cluster closed")
        if self._keeper is not None:
            self._keeper.join(2)  # a renewal under way would reopen a connection closed below
        # In parallel: closing an SSH connection waits for its reader thread to end (~25 ms each
        # under load), which one host after the other adds up to half a second at 16 hosts.
        # A frozen host's close is not waited for at all: its socket may never take the goodbye.
        with trace.span("cluster.close"):
            closers = [
                (threading.Thread(target=agent.close, daemon=True), agent.late) for agent in self.agents.values()
            ]
            for closer, _late in closers:
                closer.start()
            until = time.monotonic() + CLOSE_PATIENCE
            for closer, late in closers:
                if not late:
                    closer.join(max(0.0, until - time.monotonic()))

    def fan_out(
        self,
        hosts: Iterable[str],
        fn: Callable[[HostAgent], T],
        deadline: float | None = None,
        deadlines: Mapping[str, float] | None = None,
    ) -> GroupResult[T]:
        """`fn` on the agent of every host in parallel; each host's failure is kept as data, and
        with `deadline` (or a host's own in `deadlines`) a host not answering by then is one
        (see `group.fan_out`)."""
        return fan_out([self.agents[h] for h in hosts], lambda a: a.host, fn, deadline=deadline, deadlines=deadlines)

    @staticmethod
    def by_host(tasks: Iterable[TaskSpec]) -> dict[str, list[TaskSpec]]:
        grouped: dict[str, list[TaskSpec]] = defaultdict(list)
        for t in tasks:
            grouped[t.host].append(t)
        return grouped

    # ---------------------------------------------------------------- queries

    def status(
        self,
        tasks: Sequence[TaskSpec] | None = None,
        progress: ProgressRule | None = None,
        tail: int = 0,
        wait_listening: float = 0.0,
        usage_history: int = 0,
        usage_points: int = 0,
        count_lines: bool = False,
        skip_hosts: Collection[str] = (),
    ) -> tuple[list[TaskStatus], dict[str, Exception]]:
        """Every task's status (with its recent progress lines, given the `progress` rule, its
        last `tail` output lines and `usage_history` usage samples, or `usage_points` over its
        whole life; with `count_lines`, its output lines), plus the hosts that could not be asked
        (their tasks: `unreachable`). One request per host; with `wait_listening`, each host
        answers once its tasks listen or have ended, or after that many seconds. `skip_hosts`:
        hosts not asked (known silent: a frozen host would hold the look for `deadlines.status`);
        their tasks are `unreachable`."""
        tasks = list(tasks if tasks is not None else self.record.tasks)
        answers = self._ask_status(
            [t for t in tasks if t.host not in skip_hosts],
            wait_listening,
            progress=progress,
            tail=tail,
            usage_history=usage_history,
            usage_points=usage_points,
            count_lines=count_lines,
        )
        infos = {name: info for answer in answers.succeeded.values() for name, info in answer.tasks.items()}
        tails = {name: lines for answer in answers.succeeded.values() for name, lines in answer.tails.items()}
        clock = {host: answer.time for host, answer in answers.succeeded.items()}
        problems = {host: answer.disk for host, answer in answers.succeeded.items()}
        since = self.record.unreachable
        return [
            TaskStatus.of(
                t, infos.get(t.name), since.get(t.host), clock.get(t.host), tails.get(t.name), problems.get(t.host)
            )
            for t in tasks
        ], answers.failed

    def _ask_status(self, tasks: Sequence[TaskSpec], wait: float = 0.0, **asked: Any) -> GroupResult[StatusAnswer]:
        """Each host's answer about its tasks among `tasks`, one request per host; `asked`: the
        request's optional fields (progress, tail, usage_history)."""
        grouped = self.by_host(tasks)
        return self.fan_out(
            grouped,
            lambda a: a.call(
                StatusRequest(
                    self.record.run_id, {t.name: t.port for t in grouped[a.host]}, wait_listening=wait, **asked
                ),
                timeout=STATUS_TIMEOUT + wait,
            ),
            deadline=self.deadlines.status + wait,
        )

    def busy_ports(self, tasks: Sequence[TaskSpec]) -> dict[str, PortInfo]:
        """address -> who listens there, for every task port something already listens on."""
        grouped = self.by_host(tasks)
        answers = self.fan_out(grouped, lambda a: a.call(PortsRequest([t.port for t in grouped[a.host]])))
        answers.raise_if_failed("checking ports")
        busy = {}
        for t in tasks:
            info = answers.succeeded[t.host].ports[str(t.port)]
            if info.listening:
                busy[t.address] = info
        return busy

    def tails(self, names: Sequence[str], count: int) -> dict[str, list[str]]:
        """The last `count` output lines of each named task, one call per host."""
        grouped = self.by_host(self.record.task(n) for n in names)
        answers = self.fan_out(
            grouped, lambda a: a.call(TailRequest(self.record.run_id, [t.name for t in grouped[a.host]], count))
        )
        return {task: lines for answer in answers.succeeded.values() for task, lines in answer.tails.items()}

    def last_lines_text(self, task: str, count: int = 10) -> str:
        """`\\nlast N lines of TASK:` (`last line` for one) and the lines, for an error message; empty if none."""
        lines = [cut_line(line) for line in self.tails([task], count).get(task, [])]
        head = f"last {len(lines)} lines" if len(lines) > 1 else "last line"
        return (f"\n{head} of {task}:\n" + "\n".join(f"  {line}" for line in lines)) if lines else ""

    def reachable(self, source: str, address: str) -> bool | None:
        """Can a task on `source` open a TCP connection to `address`? None when unknown."""
        try:
            answer = self.agents[source].call(ProbeRequest([address], 3.0))
        except (HostError, KeyError):
            return None
        return answer.results[address].ok

    def preflight(
        self,
        progress: Progress = quiet,
        gpu_hosts: Collection[str] = (),
        boxes: Mapping[str, ContainerLaunch] = {},
        heard: Progress = quiet,
        modules: Mapping[str, list[str]] = {},
    ) -> list[HostInfo]:
        """Reach every host (auth, host keys); learn, in parallel, its Python, TensorFlow, cores,
        (`gpu_hosts`) GPUs and which of its `modules` the Python lacks, or in a container (`boxes`)
        the image's, a pull's lines `heard` as they come."""
        hosts = sorted(self.agents)
        for host in hosts:
            progress(host, "connecting")
        answers = self.fan_out(
            hosts,
            lambda a: a.call(
                InfoRequest(a.python, a.host in gpu_hosts, boxes.get(a.host), modules.get(a.host, [])),
                timeout=120 + (boxes[a.host].pull_timeout if a.host in boxes else 0),
                on_note=lambda line: heard(a.host, line),
            ),
        )
        answers.raise_if_failed("connecting to hosts")
        if unfit := {h: a.container_error for h, a in sorted(answers.succeeded.items()) if a.container_error}:
            lines = "\n".join(f"  {host}: {why}" for host, why in unfit.items())
            raise StartupError(f"the tasks' containers cannot run:\n{lines}", hint="see docs/guide/containers.md")
        infos = []
        for host in hosts:
            a = answers.succeeded[host]
            devices = HostDevices(tuple(g.index for g in a.gpus), tuple(a.cpus), a.gpu_error)
            infos.append(
                HostInfo(
                    host,
                    a.hostname,
                    a.python,
                    a.tensorflow,
                    a.python_error,
                    devices,
                    a.filesystem,
                    a.python_executable or "",
                    a.container,
                    tuple(a.missing_modules),
                )
            )
            inside = f" in {a.container}" if a.container else ""
            where = f" ({a.python_executable}{inside})" if a.python_executable else ""
            gpus = f", {len(a.gpus)} GPU{'s' if len(a.gpus) != 1 else ''}" if host in gpu_hosts else ""
            tf = a.tensorflow or ("no tensorflow in the image" if a.container else "no tensorflow")
            if a.container_fetched:
                progress(host, a.container_fetched)
            progress(host, f"ok: python {a.python or '?'}{where}, {tf}{gpus}")
        return infos

    def check_reachable(
        self, sources: Sequence[str], targets: Sequence[str], progress: Progress = quiet, timeout: float = 3.0
    ) -> None:
        """From every source host, a TCP connect to every target: a worker that cannot reach its
        ps would otherwise wait in CreateSession forever. Raises StartupError listing each failure."""
        if not sources or not targets:
            return
        answers = self.fan_out(sources, lambda a: a.call(ProbeRequest(list(targets), timeout)))
        answers.raise_if_failed("reachability check")
        failures = [
            ProbeFailure(host, target, result)
            for host, answer in sorted(answers.succeeded.items())
            for target, result in answer.results.items()
            if not result.ok
        ]
        total = len(sources) * len(targets)
        if failures:
            raise StartupError(
                f"{len(failures)} of {total} connections failed in the reachability check:\n"
                + "\n".join(f"  {f}" for f in failures),
                hint="tasks on those hosts would wait forever for their peers; fix the network or the addresses",
            )
        progress(
            "",
            f"reachability: {len(sources)} host{'s' if len(sources) != 1 else ''} -> "
            f"{', '.join(targets)}: all {total} connections ok",
        )

    # ---------------------------------------------------------------- commands

    def start_tasks(self, tasks: Sequence[TaskSpec], again: str = "") -> dict[str, TaskInfo]:
        """Start these tasks, each host's at once; raises if a host failed to start them.
        `again`: a task that ended on its host starts afresh there (`StartRequest.again`)."""
        grouped = self.by_host(tasks)
        record = self.record
        lease = record.lease_timeout if self.holds_lease else 0.0
        started = self.fan_out(
            grouped,
            lambda a: a.call(
                StartRequest(
                    record.run_id,
                    [
                        TaskLaunch(
                            t.name,
                            t.command,
                            dict(t.env),
                            t.cwd,
                            record.grace_period,
                            record.store,
                            self._idle_rule(t),
                            t.restart.rule() if t.restart else None,
                            None if t.container else bin_dir(self.agents[a.host].python),
                            None if t.cpus is None else list(t.cpus),
                            t.container,
                            t.claims,
                        )
                        for t in grouped[a.host]
                    ],
                    lease,
                    spawn=self.launcher is None,
                    again=again,
                )
            ),
        )
        if lease:
            self._keep_lease(started.succeeded)
        started.raise_if_failed("starting tasks")
        if self.launcher is not None:
            return self._launch_monitors(self.launcher, grouped)
        return {name: info for answer in started.succeeded.values() for name, info in answer.tasks.items()}

    def _launch_monitors(self, launcher: MonitorLauncher, grouped: dict[str, list[TaskSpec]]) -> dict[str, TaskInfo]:
        """Start prepared tasks' monitors through the backend; their states once each task runs
        or has failed to."""
        for host, tasks in grouped.items():
            launcher.launch(host, self.agents[host], self.record.run_id, tasks)
        deadline = time.monotonic() + LAUNCH_PATIENCE
        while True:
            answers = self._ask_status([t for tasks in grouped.values() for t in tasks])
            answers.raise_if_failed("starting tasks")
            infos = {name: info for answer in answers.succeeded.values() for name, info in answer.tasks.items()}
            if time.monotonic() > deadline or all(i.state not in STARTING_STATES for i in infos.values()):
                return infos
            time.sleep(0.1)

    def _idle_rule(self, task: TaskSpec) -> IdleRule | None:
        """The idle rule for a task that never ends by itself: every task the success policy
        does not watch (`supervisor.guard`)."""
        record = self.record
        if not record.idle_timeout or not record.decisive or task.name in record.decisive:
            return None
        if task not in record.tasks:  # a setup shell: the run has not started yet
            return None
        watch = {name: record.task(name).address for name in record.decisive}
        return IdleRule(task.port, record.idle_timeout, watch, record.startup_timeout)

    def leave(self, host: str) -> None:
        """`host` is no longer the run's (its tasks moved): its lease is renewed no more."""
        with self._lease_lock:
            self._leases.leave(host)

    def stop_left_behind(self, host: str, timeout: float) -> StopAnswer:
        """Stop what the run left on a host it left (every process with its marker there)."""
        grace = self.record.grace_period
        return self.agents[host].call(StopRequest(self.record.run_id, grace), timeout=grace + timeout)

    def _keep_lease(self, hosts: Iterable[str]) -> None:
        """Renew the run's lease on these hosts (and those already held) until `close()`."""
        with self._lease_lock:
            self._leases.hold(hosts)
            if self._keeper is not None:
                return
            self._keeper = threading.Thread(target=self._renew_lease, daemon=True, name="lease")
            self._keeper.start()

    def _renew_lease(self) -> None:
        """Every `Leases.every` seconds, the renewals `engine.leasing` says are due, each on a
        thread of its own."""
        while not self._closed.wait(self._leases.every):
            with self._lease_lock:
                due = self._leases.due()
            for host in due:
                threading.Thread(target=self._renew_on, args=(host,), daemon=True, name="lease").start()

    def _renew_on(self, host: str) -> None:
        try:
            self.agents[host].call(StatusRequest(self.record.run_id, {}, renew_lease=True), timeout=30)
        except HostError:
            pass  # the next renewal tries again; a host silent for host_timeout fails the run
        finally:
            with self._lease_lock:
                self._leases.answered(host)

    def hold_ports(self, ports_by_host: dict[str, list[int]], marker: str, seconds: float) -> None:
        """Throw-away listeners on these ports (stopped by `stop` of `marker`), to test the network."""
        held = self.fan_out(
            ports_by_host, lambda a: a.call(ListenRequest(marker, ports_by_host[a.host], seconds, self.record.store))
        )
        held.raise_if_failed("opening test listeners")

    def release_ports(self, hosts: Iterable[str], marker: str) -> None:
        self.fan_out(hosts, lambda a: a.call(StopRequest(marker, 1.0)))

    def pick_ports(self, wanted: dict[str, tuple[int, list[int]]], seconds: float) -> dict[str, list[int]]:
        """host -> free ports its supervisor picked (wanted: host -> (how many, which to avoid)),
        each held by a listener marked with the run until `free_picked_ports`."""
        answers = self.fan_out(
            wanted,
            lambda a: a.call(
                PickPortsRequest(self.record.run_id, wanted[a.host][0], wanted[a.host][1], seconds, self.record.store)
            ),
        )
        if answers.failed:
            self.free_picked_ports(answers.succeeded)
        answers.raise_if_failed("picking free ports")
        return {host: answer.ports for host, answer in answers.succeeded.items()}

    def free_picked_ports(self, hosts: Iterable[str]) -> None:
        """Stop the listeners holding the picked ports (no task of the run runs yet: this stops
        only them), so the tasks can bind their ports."""
        self.fan_out(hosts, lambda a: a.call(StopRequest(self.record.run_id, 1.0, tasks=[])))

    def stop_tasks(self, tasks: Sequence[TaskSpec]) -> None:
        """Stop these tasks (their grace period, then SIGKILL) and wait until they are gone;
        raises if a host could not stop them."""
        grouped = self.by_host(tasks)
        grace = self.record.grace_period
        self.fan_out(
            grouped,
            lambda a: a.call(
                StopRequest(self.record.run_id, grace, tasks=[t.name for t in grouped[a.host]]), timeout=grace + 120
            ),
            deadline=grace + self.deadlines.stop,
        ).raise_if_failed("stopping tasks")

    def stop(self, grace: float | None = None, silent: Collection[str] = ()) -> StopReport:
        """Stop every task of the run on every host and check the processes and ports are gone.
        `silent`: hosts already judged lost, asked too but waited for only `deadlines.silent_stop`
        (a frozen host would hold the run's end for the whole `deadlines.stop`)."""
        grace = self.record.grace_period if grace is None else grace
        hosts = sorted(h.name for h in self.record.hosts)
        lost = sorted(h.name for h in self.record.lost_hosts)
        ports = {h: sorted({t.port for t in self.record.tasks if t.host == h}) for h in hosts}
        ports.update({h: [] for h in lost})
        answers = self.fan_out(
            hosts + lost,
            lambda a: a.call(
                StopRequest(self.record.run_id, grace, ports[a.host]),
                timeout=grace + (LOST_HOST_PATIENCE if a.host in lost else 120),
            ),
            deadline=grace + self.deadlines.stop,
            deadlines={h: self.deadlines.silent_stop for h in silent},
        )
        lost_silent = {h: error_text(e) for h, e in answers.failed.items() if h in lost}
        remaining: dict[str, list[int]] = {}
        busy: dict[str, list[int]] = {}
        for host, answer in answers.succeeded.items():
            if answer.remaining:
                remaining[host] = answer.remaining
            for port, info in answer.ports.items():  # checked on the host once all was stopped
                if info.listening:
                    busy[f"{host}:{port}"] = info.pids
        return StopReport(
            processes=sum(answer.processes for answer in answers.succeeded.values()),
            remaining=remaining,
            busy_ports=busy,
            hosts=len(hosts),
            ports=sorted({port for host in answers.succeeded for port in ports[host]}),
            unreachable={h: error_text(e) for h, e in answers.failed.items() if h not in lost},
            lost_silent=lost_silent,
            containers=sum(answer.containers for answer in answers.succeeded.values()),
            containers_left={h: a.containers_left for h, a in answers.succeeded.items() if a.containers_left},
            ended=sum(answer.ended for answer in answers.succeeded.values()),
        )
