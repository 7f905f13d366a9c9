"""up / status / down over the tasks of a run, on every host at once.

Generic orchestration: it starts tasks in the phases a plan gives, waits for ports, decides when
a run is over and stops everything. It knows nothing of TensorFlow (see `tf/`) and nothing of
rendering (it reports progress through a callback the CLI renders).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from tfctl.errors import HostError, StartupError
from tfctl.group import GroupResult, fan_out
from tfctl.hostagent import HostAgent
from tfctl.runs import RunRecord, TaskSpec
from tfctl.transport import connect

FINAL_STATES = ("succeeded", "failed", "stopped", "lost")
Progress = Callable[[str, str], None]  # (task or host, message)


def _quiet(_who: str, _msg: str) -> None:
    """Progress sink for callers that render nothing."""


@dataclass(frozen=True)
class TaskStatus:
    """What is true about one task right now, as its host's supervisor sees it."""

    task: str
    job: str
    index: int
    host: str
    port: int
    state: str
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    listening: bool = False
    uptime: float | None = None
    last_line: str = ""
    error: str | None = None
    ended_at: float | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def describe_end(self) -> str:
        if self.state == "lost":
            return "was lost (its process is gone and no exit code was recorded)"
        if self.signal:
            return f"was killed by signal {self.signal}"
        if self.error:
            return self.error
        return f"exited with code {self.exit_code}"

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "job": self.job, "index": self.index, "host": self.host, "port": self.port,
                "state": self.state, "pid": self.pid, "exit_code": self.exit_code, "signal": self.signal,
                "listening": self.listening, "uptime": self.uptime, "last_line": self.last_line}


@dataclass(frozen=True)
class Phase:
    """Tasks started together; the next phase waits until `wait_listening` tasks listen.

    `wait_limit` None: not listening within the startup timeout fails the start; a number: wait
    at most that long, then go on (an ordering hint, not a requirement). With `probe`, once they
    listen, every host of this and later phases must reach them by TCP before anything else starts.
    """

    tasks: tuple[TaskSpec, ...]
    wait_listening: tuple[str, ...] = ()
    wait_limit: float | None = None
    probe: bool = False


PROBE_CAUSES = {
    "refused": "connection refused: nothing listens there as seen from this host "
               "(wrong address, or the name leads to another machine)",
    "timeout": "timed out: a firewall drops the traffic, or the host is down",
    "unresolvable": "the name does not resolve on this host: add it to DNS or /etc/hosts there, or use an IP",
    "unreachable": "no route to that address from this host",
}


@dataclass(frozen=True)
class ProbeFailure:
    source: str
    target: str
    error: str
    address: str | None
    local: bool
    detail: str | None = None

    def __str__(self) -> str:
        why = PROBE_CAUSES.get(self.error, self.error)
        if self.local and self.error == "refused":
            why = (f"the name resolves to {self.address}, an address of {self.source} itself, "
                   f"where nothing listens on that port")
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.source} -> {self.target}: {why}{extra}"


@dataclass(frozen=True)
class HostInfo:
    host: str
    hostname: str
    python: str | None
    tensorflow: str | None
    error: str | None = None


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    reason: str
    culprit: str | None = None


@dataclass
class StopReport:
    processes: int = 0
    remaining: dict[str, list[int]] = field(default_factory=dict)
    busy_ports: dict[str, list[int]] = field(default_factory=dict)
    hosts: int = 0
    ports: list[int] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.remaining and not self.busy_ports and not self.unreachable


class Cluster:
    """One run's tasks and the supervisors on its hosts; connections open on first use."""

    def __init__(self, record: RunRecord, agents: dict[str, HostAgent] | None = None,
                 accept_new_host_keys: bool = False) -> None:
        self.record = record
        self.agents = agents or {h.name: HostAgent(connect(h, accept_new_host_keys), h.python, h.root)
                                 for h in record.hosts}

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()

    def _by_host(self, tasks: Iterable[TaskSpec]) -> dict[str, list[TaskSpec]]:
        grouped: dict[str, list[TaskSpec]] = defaultdict(list)
        for t in tasks:
            grouped[t.host].append(t)
        return grouped

    def _fan_out(self, hosts: Iterable[str], fn: Callable[[HostAgent], Any]) -> GroupResult[Any]:
        return fan_out([self.agents[h] for h in hosts], lambda a: a.host, fn)

    # ---------------------------------------------------------------- status

    def status(self, tasks: Sequence[TaskSpec] | None = None) -> tuple[list[TaskStatus], dict[str, Exception]]:
        """Every task's status, plus the hosts that could not be asked (their tasks: 'unknown')."""
        tasks = list(tasks if tasks is not None else self.record.tasks)
        grouped = self._by_host(tasks)
        answers = self._fan_out(grouped, lambda a: a.call(
            "status", {"run_id": self.record.run_id, "tasks": {t.name: t.port for t in grouped[a.host]}}))
        out = []
        for t in tasks:
            info = answers.succeeded.get(t.host, {}).get("tasks", {}).get(t.name)
            if info is None:
                out.append(TaskStatus(t.name, t.job, t.index, t.host, t.port, "unknown"))
                continue
            out.append(TaskStatus(t.name, t.job, t.index, t.host, t.port, info["state"], info.get("pid"),
                                  info.get("exit_code"), info.get("signal"), bool(info.get("listening")),
                                  info.get("uptime"), info.get("last_line", ""), info.get("error"),
                                  info.get("ended_at")))
        return out, answers.failed

    def busy_ports(self, tasks: Sequence[TaskSpec]) -> dict[str, dict[str, Any]]:
        """address -> who listens there, for every task port something already listens on."""
        grouped = self._by_host(tasks)
        answers = self._fan_out(grouped, lambda a: a.call("ports", {"ports": [t.port for t in grouped[a.host]]}))
        answers.raise_if_failed("checking ports")
        busy = {}
        for t in tasks:
            info = answers.succeeded[t.host]["ports"][str(t.port)]
            if info["listening"]:
                busy[t.address] = info
        return busy

    # ---------------------------------------------------------------- start

    def start(self, phases: Sequence[Phase], timeout: float, progress: Progress = _quiet) -> None:
        """Start phase by phase; on any failure stop everything started and raise StartupError."""
        try:
            for phase in phases:
                grouped = self._by_host(phase.tasks)
                for t in phase.tasks:
                    progress(t.name, f"starting on {t.host}")
                started = self._fan_out(grouped, lambda a: a.call("start", {
                    "run_id": self.record.run_id,
                    "tasks": [{"task": t.name, "command": t.command, "env": t.env, "cwd": t.cwd,
                               "grace": self.record.grace_period, "store": self.record.store}
                              for t in grouped[a.host]]}))
                started.raise_if_failed("starting tasks")
                for answer in started.succeeded.values():
                    for name, info in answer["tasks"].items():
                        if info["state"] in FINAL_STATES:
                            raise StartupError(f"{name} {info.get('error') or 'exited at once'}"
                                               + self._last_lines_text(name))
                        progress(name, f"running (pid {info['pid']})")
                listening = self._wait_listening(phase.wait_listening, phase.wait_limit or timeout, progress,
                                                 required=phase.wait_limit is None) if phase.wait_listening else []
                if phase.probe:
                    later = [t for p in phases[phases.index(phase):] for t in p.tasks]
                    self.check_reachable(sorted({t.host for t in later}),
                                         [self.record.task(n).address for n in listening], progress)
        except BaseException:
            progress("", "stopping what was started")
            self.stop()
            raise

    def check_reachable(self, sources: Sequence[str], targets: Sequence[str], progress: Progress = _quiet,
                        timeout: float = 3.0) -> None:
        """From every source host, a TCP connect to every target: a worker that cannot reach its
        ps would otherwise wait in CreateSession forever. Raises StartupError listing each failure."""
        if not sources or not targets:
            return
        answers = self._fan_out(sources, lambda a: a.call("probe", {"targets": list(targets), "timeout": timeout}))
        answers.raise_if_failed("reachability check")
        failures = [ProbeFailure(host, target, r["error"], r.get("address"), bool(r.get("local")), r.get("detail"))
                    for host, answer in sorted(answers.succeeded.items())
                    for target, r in answer["results"].items() if not r["ok"]]
        if failures:
            raise StartupError(
                f"{len(failures)} of {len(sources) * len(targets)} connections failed in the reachability check:\n"
                + "\n".join(f"  {f}" for f in failures),
                hint="tasks on those hosts would wait forever for their peers; fix the network or the addresses")
        progress("", f"reachability: {len(sources)} host{'s' if len(sources) != 1 else ''} -> "
                     f"{', '.join(targets)}: all {len(sources) * len(targets)} connections ok")

    def preflight(self, progress: Progress = _quiet) -> list[HostInfo]:
        """Reach every host (auth, host keys) and learn its Python and TensorFlow, in parallel."""
        hosts = sorted(self.agents)
        for host in hosts:
            progress(host, "connecting")
        answers = self._fan_out(hosts, lambda a: a.call("info", {"python": a.python}, timeout=60))
        answers.raise_if_failed("connecting to hosts")
        infos = []
        for host in hosts:
            a = answers.succeeded[host]
            infos.append(HostInfo(host, a["hostname"], a.get("python"), a.get("tensorflow"), a.get("python_error")))
            progress(host, f"ok: python {a.get('python') or '?'}, {a.get('tensorflow') or 'no tensorflow'}")
        return infos

    def _wait_listening(self, names: Sequence[str], timeout: float, progress: Progress, required: bool = True
                        ) -> list[str]:
        """Wait until the tasks listen; returns those that do. A task that already finished with
        exit 0 needs no waiting for; one that failed, or (if `required`) never listens, is fatal."""
        tasks = [self.record.task(n) for n in names]
        waiting = {t.name for t in tasks}
        listening: list[str] = []
        deadline = time.monotonic() + timeout
        began = time.monotonic()
        while waiting:
            statuses, _unreachable = self.status([t for t in tasks if t.name in waiting])
            for s in statuses:
                if s.listening:
                    waiting.discard(s.task)
                    listening.append(s.task)
                    progress(s.task, f"listening on {s.host}:{s.port} ({time.monotonic() - began:.1f}s)")
                elif s.state == "succeeded":
                    waiting.discard(s.task)  # done before it was needed: nothing to wait for
                elif s.final:
                    raise StartupError(f"{s.task} {s.describe_end()} before listening on port {s.port}"
                                       + self._last_lines_text(s.task))
            if waiting and time.monotonic() > deadline:
                if not required:
                    progress(", ".join(sorted(waiting)), f"not listening after {timeout:g}s; starting the rest anyway")
                    return listening
                name = sorted(waiting)[0]
                raise StartupError(
                    f"{name} did not listen on {self.record.task(name).address} within {timeout:g}s"
                    + self._last_lines_text(name),
                    hint="raise startup_timeout in the cluster file if the task is just slow to start")
            if waiting:
                time.sleep(0.2)
        return listening

    def tails(self, names: Sequence[str], count: int) -> dict[str, list[str]]:
        """The last `count` output lines of each named task, one call per host."""
        grouped = self._by_host(self.record.task(n) for n in names)
        answers = self._fan_out(grouped, lambda a: a.call(
            "tail", {"run_id": self.record.run_id, "tasks": [t.name for t in grouped[a.host]], "lines": count}))
        return {task: lines for answer in answers.succeeded.values() for task, lines in answer["tails"].items()}

    def reachable(self, source: str, address: str) -> bool | None:
        """Can a task on `source` open a TCP connection to `address`? None when unknown."""
        try:
            result = self.agents[source].call("probe", {"targets": [address], "timeout": 3})
        except (HostError, KeyError):
            return None
        return bool(result["results"][address]["ok"])

    def _last_lines_text(self, task: str, count: int = 10) -> str:
        lines = self.last_lines(task, count)
        return (f"\nlast {len(lines)} lines of {task}:\n" + "\n".join(f"  {l}" for l in lines)) if lines else ""

    def last_lines(self, task: str, count: int) -> list[str]:
        return self.tails([task], count).get(task, [])

    # ---------------------------------------------------------------- run to the end

    def supervise(self, decisive: Sequence[str], essential: Sequence[str], poll: float = 0.5,
                  host_patience: float = 60.0, on_status: Callable[[list[TaskStatus]], None] | None = None,
                  cancelled: Callable[[], bool] = lambda: False,
                  judge: Callable[[list[TaskStatus]], Outcome | None] | None = None) -> Outcome:
        """Watch the run until it is decided: decisive tasks all succeeded, or something failed.

        `judge` may decide earlier from what states alone cannot show (a task hung for good).
        """
        unreachable_since: dict[str, float] = {}
        while not cancelled():
            statuses, unreachable = self.status()
            now = time.monotonic()
            for host in list(unreachable_since):
                if host not in unreachable:
                    del unreachable_since[host]
            for host, err in unreachable.items():
                since = unreachable_since.setdefault(host, now)
                if now - since > host_patience:
                    return Outcome(False, f"lost contact with {host} for {host_patience:g}s: {err}")
            if on_status:
                on_status(statuses)
            outcome = decide(statuses, decisive, essential) or (judge(statuses) if judge else None)
            if outcome is not None:
                return outcome
            deadline = time.monotonic() + poll
            while time.monotonic() < deadline and not cancelled():  # notice a cancel at once
                time.sleep(0.02)
        return Outcome(False, "supervision cancelled")

    # ---------------------------------------------------------------- stop

    def stop(self, grace: float | None = None, hosts: Iterable[str] | None = None) -> StopReport:
        """Stop every task of the run on every host and check the processes and ports are gone."""
        grace = self.record.grace_period if grace is None else grace
        hosts = sorted(set(hosts) if hosts is not None else {h.name for h in self.record.hosts})
        ports = {h: sorted({t.port for t in self.record.tasks if t.host == h}) for h in hosts}
        answers = self._fan_out(hosts, lambda a: a.call(
            "stop", {"run_id": self.record.run_id, "grace": grace, "ports": ports[a.host]}, timeout=grace + 120))
        report = StopReport(hosts=len(hosts))
        report.unreachable = {h: str(getattr(e, "message", e)) for h, e in answers.failed.items()}
        for host, answer in answers.succeeded.items():
            report.processes += answer["processes"]
            if answer["remaining"]:
                report.remaining[host] = answer["remaining"]
            for port, info in answer["ports"].items():  # checked on the host once all was stopped
                if info["listening"]:
                    report.busy_ports[f"{host}:{port}"] = info["pids"]
            report.ports.extend(ports[host])
        report.ports = sorted(set(report.ports))
        return report


def decide(statuses: Sequence[TaskStatus], decisive: Sequence[str], essential: Sequence[str]) -> Outcome | None:
    """The run's outcome from its tasks' states, or None while it is still undecided."""
    by_name = {s.task: s for s in statuses}
    for s in statuses:
        if s.state in ("failed", "lost"):
            return Outcome(False, f"{s.task} on {s.host} {s.describe_end()}", s.task)
    for s in statuses:
        if s.state == "stopped":
            return Outcome(False, f"{s.task} on {s.host} was stopped (tfctl down)", s.task)
    if decisive and all(d in by_name and by_name[d].state == "succeeded" for d in decisive):
        done = ", ".join(decisive)
        return Outcome(True, f"{done} finished successfully")
    for name in essential:
        s = by_name.get(name)
        if s is not None and s.final:
            return Outcome(False, f"{s.task} on {s.host} ended while the job was running ({s.describe_end()})",
                           s.task)
    return None

