"""The control loops of a run: start it phase by phase, then supervise it until it is decided.

Generic orchestration over a `Cluster`: which phase starts when, what a failed start cleans up,
when a run is over and how it ended. It knows nothing of TensorFlow (`tf/` builds the phases and
the hang judge) and renders nothing (progress goes to a callback).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from tfctl.cluster.supervisors import Cluster, Progress, quiet
from tfctl.cluster.task_status import TaskStatus
from tfctl.config.model import DEFAULT_HOST_TIMEOUT, host_port
from tfctl.errors import StartupError
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.supervisor.protocol import RunState, TaskState

# Waiting for a port, each host waits on its own ports (StatusRequest.wait_listening) for at most
# LISTEN_WAIT seconds per request, so Ctrl-C and a lost host are noticed within that. A host that
# answers sooner without its ports listening (it could not be asked) is asked again after a pause:
# 0.05 s at first, then a tenth of the time waited so far (at most 0.5 s).
LISTEN_WAIT = 1.0
LISTEN_POLL = 0.05
LISTEN_POLL_MAX = 0.5
# A refused probe of a task that had listened: how long to look for its end before calling the
# network at fault (a task that exits as the probe reaches it is not yet recorded as ended).
PROBE_SETTLE = 3.0
# How often a run's controller asks every host how its tasks are, for the run's whole life. Each
# ask costs the host a supervisor request and the controller an SSH round trip: at 0.5 s that was
# a quarter of what a logging 3-host run took from training (0.014 of a core); a run's end is now
# noticed within a second rather than half of one.
SUPERVISE_POLL = 1.0


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


@dataclass(frozen=True)
class Outcome:
    """How a run ended (or must end): the run state to record, why, and the task to blame."""

    state: RunState
    reason: str
    culprit: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.state is RunState.SUCCEEDED


Judge = Callable[[list[TaskStatus]], "Outcome | None"]
# A host lost (host, why in words, the tasks elsewhere that ended badly meanwhile): True once its
# tasks run elsewhere, those ended ones started again, and the run goes on.
LostHost = Callable[[str, str, tuple[str, ...]], bool]


def start(
    cluster: Cluster, phases: Sequence[Phase], timeout: float, progress: Progress = quiet, again: str = ""
) -> None:
    """Start phase by phase; on any failure (Ctrl-C included) stop everything started, then raise.
    `again`: tasks that ended on their hosts start afresh (tasks moved, or restarted for a move)."""
    try:
        for number, phase in enumerate(phases):
            for t in phase.tasks:
                progress(t.name, f"starting on {t.host}")
            for name, info in sorted(cluster.start_tasks(phase.tasks, again).items()):
                if info.state is TaskState.SUCCEEDED:  # a quick task may be done before start answers
                    progress(name, "finished already (exit code 0)")
                elif info.state.is_final:
                    end = TaskStatus.of(cluster.record.task(name), info).describe_end()
                    when = "" if info.error else ", right after it started"  # an error says that itself
                    raise StartupError(f"{name} {end}{when}" + cluster.last_lines_text(name))
                else:
                    progress(name, f"running (pid {info.pid})")
            listening: list[str] = []
            if phase.wait_listening:
                listening = wait_listening(
                    cluster,
                    phase.wait_listening,
                    phase.wait_limit or timeout,
                    progress,
                    required=phase.wait_limit is None,
                )
            if phase.probe:
                later = [t for p in phases[number:] for t in p.tasks]
                probe_listening(cluster, sorted({t.host for t in later}), listening, progress)
    except BaseException:
        stop_after_failure(cluster, progress)
        raise


def probe_listening(cluster: Cluster, sources: Sequence[str], listening: Sequence[str], progress: Progress) -> None:
    """Probe the listening tasks from every source host. A refused connection to a task that
    ended meanwhile is not a network fault: a task that finished is left out and probed no more,
    one that failed is reported as itself."""
    targets = list(listening)
    while True:
        try:
            cluster.check_reachable(sources, [cluster.record.task(n).address for n in targets], progress)
            return
        except StartupError:
            ended = _ended_meanwhile(cluster, targets)
            if not ended:
                raise
            for s in ended:
                if s.state is not TaskState.SUCCEEDED:
                    raise StartupError(f"{s.task} {s.describe_end()}" + cluster.last_lines_text(s.task)) from None
                progress(s.task, "finished already (exit code 0)")
            targets = [n for n in targets if n not in {s.task for s in ended}]


def _ended_meanwhile(cluster: Cluster, targets: Sequence[str]) -> list[TaskStatus]:
    """The targets that have ended, looking for up to PROBE_SETTLE seconds: a task that exits as
    the probe reaches it is refused a moment before its monitor has recorded its end."""
    deadline = time.monotonic() + PROBE_SETTLE
    while True:
        statuses, _unreachable = cluster.status([cluster.record.task(n) for n in targets])
        ended = [s for s in statuses if s.final]
        if ended or time.monotonic() > deadline:
            return ended
        time.sleep(0.2)


def stop_after_failure(cluster: Cluster, progress: Progress) -> None:
    """A start that failed (or was interrupted) stops whatever of the run it started, and says
    what it could not."""
    progress("", "stopping what was started")
    report = cluster.stop()
    for host, why in sorted(report.unreachable.items()):
        progress(host, f"could not be checked: {why}; run `tfctl down` once it answers")
    for host, pids in sorted(report.remaining.items()):
        progress(host, f"still running: pids {', '.join(map(str, pids))}; run `tfctl down`")


def wait_listening(
    cluster: Cluster, names: Sequence[str], timeout: float, progress: Progress = quiet, required: bool = True
) -> list[str]:
    """Wait until the tasks listen; returns those that do. A task that already finished with
    exit 0 needs no waiting for; one that failed, or (if `required`) never listens, is fatal."""
    tasks = [cluster.record.task(n) for n in names]
    waiting = {t.name for t in tasks}
    listening: list[str] = []
    began = time.monotonic()
    deadline = began + timeout
    while waiting:
        asked = time.monotonic()
        wait = max(0.0, min(LISTEN_WAIT, deadline - asked))
        statuses, _unreachable = cluster.status([t for t in tasks if t.name in waiting], wait_listening=wait)
        for s in statuses:
            if s.listening:
                waiting.discard(s.task)
                listening.append(s.task)
                progress(s.task, f"listening on {host_port(s.host, s.port)} ({time.monotonic() - began:.1f}s)")
            elif s.state is TaskState.SUCCEEDED:
                waiting.discard(s.task)  # done before it was needed: nothing to wait for
            elif s.final:
                raise StartupError(
                    f"{s.task} {s.describe_end()} before listening on port {s.port}" + cluster.last_lines_text(s.task)
                )
        if waiting and time.monotonic() > deadline:
            if not required:
                progress(", ".join(sorted(waiting)), f"not listening after {timeout:g}s; starting the rest anyway")
                return listening
            name = sorted(waiting)[0]
            raise StartupError(
                f"{name} did not listen on {cluster.record.task(name).address} within {timeout:g}s"
                + cluster.last_lines_text(name),
                hint="raise startup_timeout in the cluster file if the task is just slow to start",
            )
        if waiting and time.monotonic() - asked < wait:
            time.sleep(min(LISTEN_POLL_MAX, max(LISTEN_POLL, (time.monotonic() - began) / 10)))
    return listening


def supervise(
    cluster: Cluster,
    poll: float | None = None,
    host_patience: float = DEFAULT_HOST_TIMEOUT,
    on_status: Callable[[list[TaskStatus]], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    judge: Judge | None = None,
    on_unreachable: Callable[[dict[str, float]], None] | None = None,
    on_lost: LostHost | None = None,
) -> Outcome:
    """Watch the run until it is decided by its tasks' states (`decide`), by `judge` (which sees
    what states cannot: a task hung for good), or by a host lost: silent for longer than
    `host_patience`, or its tasks lost with it, unless `on_lost` moved them elsewhere.
    A task that fails while another host is silent and a spare is left does not fail the run at
    once: its peer's silence is likely why (a collective's peer frozen fails the others within
    seconds, before the silence is judged). The silent host's verdict comes first: lost, the
    move starts the failed task again too; back in time, the failure stands.
    `on_unreachable` hears of every change in the silent hosts (host -> since, epoch seconds).
    `poll`: seconds between two looks (SUPERVISE_POLL, as read at the call)."""
    poll = SUPERVISE_POLL if poll is None else poll
    unreachable_since: dict[str, float] = {}
    while not cancelled():
        record = cluster.record  # a move rewrites it
        statuses, unreachable = cluster.status()
        now = time.monotonic()
        before = unreachable_since
        unreachable_since = {host: unreachable_since.get(host, now) for host in unreachable}
        if on_unreachable and unreachable_since.keys() != before.keys():
            on_unreachable({host: time.time() - (now - since) for host, since in unreachable_since.items()})
        lost = _lost_host(statuses, unreachable, unreachable_since, now, host_patience)
        if lost is not None:
            host, why = lost
            if on_lost is None or not on_lost(host, why, _ended_badly(statuses, record, host)):
                return Outcome(RunState.FAILED, why)
            continue  # its tasks run elsewhere now: look again at once
        if on_status:
            on_status(statuses)
        outcome = decide(statuses, record.decisive, record.essential)
        if outcome is not None and outcome.state is RunState.FAILED and unreachable and record.spares and on_lost:
            outcome = None  # the silent host's verdict first
        outcome = outcome or (judge(statuses) if judge else None)
        if outcome is not None:
            return outcome
        deadline = time.monotonic() + poll
        while time.monotonic() < deadline and not cancelled():  # notice a cancel at once
            time.sleep(0.02)
    return Outcome(RunState.STOPPED, "supervision cancelled")


def _lost_host(
    statuses: Sequence[TaskStatus],
    unreachable: Mapping[str, Exception],
    since: Mapping[str, float],
    now: float,
    patience: float,
) -> tuple[str, str] | None:
    """The first host lost, and why in words: silent for longer than `patience`, or a task of it
    lost (its monitor gone without a word: the host rebooted)."""
    for host, began in since.items():
        if now - began > patience:
            when = time.strftime("%H:%M:%S", time.localtime(time.time() - (now - began)))
            return host, f"lost contact with {host} since {when} ({patience:g}s, host_timeout): {unreachable[host]}"
    for s in statuses:
        if s.state is TaskState.LOST:
            return s.host, f"{s.task} on {s.host} {s.describe_end()}"
    return None


def _ended_badly(statuses: Sequence[TaskStatus], record: RunRecord, lost: str) -> tuple[str, ...]:
    """The tasks off the lost host whose end `decide` would fail the run for."""
    return tuple(
        s.task for s in statuses if s.host != lost and (s.state.is_bad or (s.task in record.essential and s.final))
    )


def decide(statuses: Sequence[TaskStatus], decisive: Sequence[str], essential: Sequence[str]) -> Outcome | None:
    """The run's outcome from its tasks' states, or None while it is still undecided."""
    by_name = {s.task: s for s in statuses}
    for s in statuses:
        if s.state.is_bad:
            return Outcome(RunState.FAILED, f"{s.task} on {s.host} {s.describe_end()}", s.task)
    if decisive and all(d in by_name and by_name[d].state is TaskState.SUCCEEDED for d in decisive):
        # Before stopped tasks: a ps its host stopped once the job was over does not undo it.
        return Outcome(RunState.SUCCEEDED, f"{', '.join(decisive)} finished successfully")
    for s in statuses:
        if s.state is TaskState.STOPPED:
            return Outcome(RunState.STOPPED, f"{s.task} on {s.host} {s.describe_end()}", s.task)
    for name in essential:
        ended = by_name.get(name)
        if ended is not None and ended.final:
            return Outcome(
                RunState.FAILED,
                f"{ended.task} on {ended.host} ended while the job was running ({ended.describe_end()})",
                ended.task,
            )
    return None
