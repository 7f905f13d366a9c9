"""The control loops of a run: start it phase by phase, then supervise it until it is decided.

Generic orchestration over a `Cluster`: which phase starts when, what a failed start cleans up,
when a run is over and how it ended. It knows nothing of TensorFlow (`tf/` builds the phases and
the hang judge) and renders nothing (progress goes to a callback).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

from tfctl.cluster.cluster import LOST_HOST_PATIENCE, Cluster, Progress, quiet
from tfctl.config.model import host_port
from tfctl.engine.clock import REAL_CLOCK, Cancel, Clock
from tfctl.engine.live_run import End, Look, Move
from tfctl.engine.observed import TaskStatus
from tfctl.engine.probing import after_refusal
from tfctl.engine.reconcile import Action, AskToStop, Reconciler, Rules, Seen
from tfctl.engine.retiring import LeftBehind
from tfctl.engine.starting import ListenWait, began
from tfctl.engine.verdicts import Outcome
from tfctl.errors import StartupError, TfctlError
from tfctl.runs.record import TaskSpec

# A refused probe of a task that had listened: how long to look for its end before calling the
# network at fault (a task that exits as the probe reaches it is not yet recorded as ended).
PROBE_SETTLE = 3.0


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
# A look with what the judges read, and what they wanted of it: every task's status, the silent
# hosts, the judges' sight.
CloserLook = Callable[["frozenset[Hashable]"], "tuple[list[TaskStatus], dict[str, Exception], object]"]


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
            answers = cluster.start_tasks(phase.tasks, again)
            heard = began([(cluster.record.task(name), info) for name, info in answers.items()])
            for name, line in heard.said:
                progress(name, line)
            if heard.failed is not None:
                task, why = heard.failed
                raise StartupError(why + cluster.last_lines_text(task))
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
    rules: Rules[Any] | None = None,
    carry_out: Callable[[Action], None] = lambda _action: None,
    on_lost: LostHost | None = None,
    closer_look: CloserLook | None = None,
    allocation_end: Callable[[], str | None] = lambda: None,
    cancel: Cancel | None = None,
    clock: Clock = REAL_CLOCK,
) -> Outcome:
    """Watch the run until it is decided: take the look the engine's last plan asked for, let it
    decide (`engine.reconcile`), carry out its actions in order, wait on `clock` as it says.
    `rules`: the run's (by default its record's, without judges); `closer_look`: the look with
    what the judges read, and their sight of it; `allocation_end`: the backend's words for the
    end of the run's allocation, None while it holds; `on_lost` moves a lost host's tasks
    elsewhere (True once they run there); `carry_out` does the other actions; `cancel` ends
    it, as stopped."""
    record = cluster.record
    rules = rules or Rules(record.decisive, record.essential, record.host_timeout)
    reconciler: Reconciler[Any] = Reconciler(rules)
    cancel = cancel or Cancel()
    answers: queue.SimpleQueue[tuple[str, LeftBehind | None]] = queue.SimpleQueue()
    plan = reconciler.first()
    while not cancel.is_set():
        began = clock.monotonic()
        sight: object | None = None
        if plan.sight and closer_look is not None:
            statuses, unreachable, sight = closer_look(plan.wants)
        else:
            statuses, unreachable = cluster.status()
        ended = allocation_end() if plan.allocation else None
        silent = {host: str(error) for host, error in unreachable.items()}
        look = Look(began, statuses, silent, can_move=bool(cluster.record.spares) and on_lost is not None)
        left = tuple(h.name for h in cluster.record.lost_hosts)
        seen = Seen(
            look, sight, plan.allocation, ended, cancel.reason if cancel.is_set() else None, left, _taken(answers)
        )
        plan = reconciler.step(seen, clock.monotonic(), clock.time())
        for action in plan.actions:
            if isinstance(action, End):
                return action.outcome
            if isinstance(action, Move):
                assert on_lost is not None  # (can_move says so)
                if not on_lost(action.host, action.why, action.ended):
                    return reconciler.move_failed(action).outcome
            elif isinstance(action, AskToStop):
                ask_to_stop(cluster, action.host, answers)
            else:
                carry_out(action)
        clock.wait(cancel, plan.look_again_in)
    return reconciler.cancelled(cancel.reason).outcome


def ask_to_stop(cluster: Cluster, host: str, answers: queue.SimpleQueue[tuple[str, LeftBehind | None]]) -> None:
    """Ask a host the run left to stop what it ran there, on a thread of its own (a silent host
    holds the request for LOST_HOST_PATIENCE); its answer (None: silent) joins the next look."""

    def ask() -> None:
        try:
            answer = cluster.stop_left_behind(host, LOST_HOST_PATIENCE)
            answers.put((host, LeftBehind(answer.processes, tuple(answer.remaining))))
        except TfctlError:
            answers.put((host, None))

    threading.Thread(target=ask, daemon=True, name=f"retire {host}").start()


def _taken(answers: queue.SimpleQueue[tuple[str, LeftBehind | None]]) -> dict[str, LeftBehind | None]:
    taken = {}
    while not answers.empty():
        host, answer = answers.get()
        taken[host] = answer
    return taken
