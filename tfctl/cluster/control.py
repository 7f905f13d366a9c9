"""The control loops of a run: start it phase by phase, then supervise it until it is decided.

Generic orchestration over a `Cluster`: which phase starts when, what a failed start cleans up,
when a run is over and how it ended. It knows nothing of TensorFlow (`tf/` builds the phases and
the hang judge) and renders nothing (progress goes to a callback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tfctl.cluster.cluster import Cluster, Progress, quiet
from tfctl.config.model import DEFAULT_HOST_TIMEOUT, host_port
from tfctl.engine.clock import REAL_CLOCK, Cancel, Clock
from tfctl.engine.live_run import Look, Move, Supervision
from tfctl.engine.observed import TaskStatus
from tfctl.engine.probing import after_refusal
from tfctl.engine.starting import ListenWait
from tfctl.engine.verdicts import Judge, Outcome
from tfctl.errors import StartupError
from tfctl.runs.record import TaskSpec
from tfctl.supervisor.protocol import TaskState

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


# A host lost (host, why in words, the tasks elsewhere that ended badly meanwhile): True once its
# tasks run elsewhere, those ended ones started again, and the run goes on.
LostHost = Callable[[str, str, tuple[str, ...]], bool]


def start(
    cluster: Cluster,
    phases: Sequence[Phase],
    timeout: float,
    progress: Progress = quiet,
    again: str = "",
    clock: Clock = REAL_CLOCK,
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
                    clock=clock,
                )
            if phase.probe:
                later = [t for p in phases[number:] for t in p.tasks]
                probe_listening(cluster, sorted({t.host for t in later}), listening, progress, clock)
    except BaseException:
        stop_after_failure(cluster, progress)
        raise


def probe_listening(
    cluster: Cluster, sources: Sequence[str], listening: Sequence[str], progress: Progress, clock: Clock = REAL_CLOCK
) -> None:
    """Probe the listening tasks from every source host. A refused connection is judged by the
    targets' ends (`engine.probing`): a task that finished is left out and probed no more, one
    that failed is reported as itself, and the network is at fault only once none ended within
    PROBE_SETTLE seconds."""
    targets = list(listening)
    while True:
        try:
            cluster.check_reachable(sources, [cluster.record.task(n).address for n in targets], progress)
            return
        except StartupError:
            refused_at = clock.monotonic()
            while True:
                statuses, _unreachable = cluster.status([cluster.record.task(n) for n in targets])
                after = after_refusal(statuses, clock.monotonic() - refused_at, PROBE_SETTLE)
                if not after.look_again:
                    break
                clock.sleep(0.2)
            if after.network_fault:
                raise
            if after.failed is not None:
                s = after.failed
                raise StartupError(f"{s.task} {s.describe_end()}" + cluster.last_lines_text(s.task)) from None
        for name in after.finished:
            progress(name, "finished already (exit code 0)")
        targets = [n for n in targets if n not in after.finished]


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
    cluster: Cluster,
    names: Sequence[str],
    timeout: float,
    progress: Progress = quiet,
    required: bool = True,
    clock: Clock = REAL_CLOCK,
) -> list[str]:
    """Wait until the tasks listen, as `engine.starting.ListenWait` decides from each answer;
    returns those that do. One that failed, or (if `required`) never listens, fails the start."""
    tasks = {n: cluster.record.task(n) for n in names}
    wait = ListenWait(names, timeout, required, clock.monotonic())
    while True:
        asked = clock.monotonic()
        looked = [tasks[n] for n in names if n in wait.waiting]
        statuses, _unreachable = cluster.status(looked, wait_listening=wait.patience(asked))
        heard = wait.heard(statuses, asked, clock.monotonic())
        for name, after in heard.listened:
            progress(name, f"listening on {host_port(tasks[name].host, tasks[name].port)} ({after:.1f}s)")
        if heard.failed is not None:
            s = heard.failed
            raise StartupError(
                f"{s.task} {s.describe_end()} before listening on port {s.port}" + cluster.last_lines_text(s.task)
            )
        if heard.late and heard.go_on:
            progress(", ".join(heard.late), f"not listening after {timeout:g}s; starting the rest anyway")
            return wait.listening
        if heard.late:
            name = heard.late[0]
            raise StartupError(
                f"{name} did not listen on {tasks[name].address} within {timeout:g}s" + cluster.last_lines_text(name),
                hint="raise startup_timeout in the cluster file if the task is just slow to start",
            )
        if heard.done:
            return wait.listening
        clock.sleep(heard.pause)


def supervise(
    cluster: Cluster,
    poll: float | None = None,
    host_patience: float = DEFAULT_HOST_TIMEOUT,
    on_status: Callable[[list[TaskStatus]], None] | None = None,
    cancel: Cancel | None = None,
    judge: Judge | None = None,
    on_unreachable: Callable[[dict[str, float]], None] | None = None,
    on_lost: LostHost | None = None,
    clock: Clock = REAL_CLOCK,
) -> Outcome:
    """Watch the run until it is decided: look at every host, let the engine decide
    (`engine.live_run`), carry out what it says. `judge` sees what states cannot (a task hung
    for good); `on_lost` moves a lost host's tasks elsewhere (True once they run there);
    `on_unreachable` hears of every change in the silent hosts (host -> since, epoch seconds);
    `cancel` ends it between two looks, as stopped. `poll`: seconds between two looks
    (SUPERVISE_POLL, as read at the call)."""
    poll = SUPERVISE_POLL if poll is None else poll
    cancel = cancel or Cancel()
    engine = Supervision(cluster.record.decisive, cluster.record.essential, host_patience)
    while not cancel.is_set():
        record = cluster.record  # a move rewrites it
        began = clock.monotonic()
        statuses, unreachable = cluster.status()
        if cancel.is_set():
            break
        silent = {host: str(error) for host, error in unreachable.items()}
        look = Look(began, statuses, silent, can_move=bool(record.spares) and on_lost is not None)
        step = engine.observe(look, clock.monotonic(), clock.time())
        if on_unreachable and step.silence is not None:
            on_unreachable(step.silence)
        verdict = step.verdict
        if isinstance(verdict, Move):
            assert on_lost is not None  # (can_move says so)
            if on_lost(verdict.host, verdict.why, verdict.ended):
                continue  # its tasks run elsewhere now (its silence ends with the next look): look again
            verdict = engine.move_failed(verdict)
        if not step.lost and on_status:
            on_status(statuses)
        if verdict is None and step.ask_judges and judge is not None:
            verdict = engine.judged(judge(statuses, clock.monotonic()))
        if verdict is not None:
            return verdict.outcome
        clock.wait(cancel, poll)
    return engine.cancelled(cancel.reason).outcome
