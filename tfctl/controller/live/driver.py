"""A started run until it is decided: attached (`up` streaming the logs) or detached (the
watcher), each with its door for `status`/`down` from other terminals, then the run's end.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from tfctl.backends.base import backend_for
from tfctl.cluster import control
from tfctl.cluster.answers import StopReport
from tfctl.cluster.cluster import Cluster
from tfctl.controller.live import reconciling, watcher
from tfctl.controller.live.launch import launch
from tfctl.controller.live.notify import Notifier
from tfctl.controller.live.restarting import Restarting
from tfctl.controller.live.resubmit import carry_on
from tfctl.controller.live.spares import Mover
from tfctl.controller.live.stopping import stop_run
from tfctl.controller.live.tracked import close_trackers, say_to_stderr
from tfctl.controller.live.watcher import Report, controller_of_this_process
from tfctl.controller.start.plan import Draft
from tfctl.engine.clock import Cancel
from tfctl.engine.reconcile import Notify
from tfctl.engine.verdicts import STOPPED_BY_DOWN, Outcome, decide
from tfctl.errors import TfctlError
from tfctl.runs import transitions
from tfctl.runs.record import ControllerKind, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState

if TYPE_CHECKING:
    from tfctl.backends.base import BackendReport
    from tfctl.cluster.output import LogFollower

LOG_DRAIN_SECONDS = 10.0
UNREACHABLE_DRAIN_SECONDS = 1.0  # the same, when a host could not be reached to stop its tasks
READ_REST_PATIENCE = 5.0  # seconds to read the last lines of tasks stopped to start anew (a move)
STOP_PATIENCE = 60.0  # past the grace period, a `down` that began a stop and said nothing more is gone


@dataclass(frozen=True)
class Ending:
    """How an attached or watched run ended."""

    outcome: Outcome
    stop: StopReport
    record: RunRecord
    backend: BackendReport | None = None  # what the run's backend said once it released it
    handed_over: str | None = None  # taken up by the next allocation's controller, nothing stopped: why


def finish(
    store: RunStore,
    cluster: Cluster,
    outcome: Outcome,
    notifier: Notifier | None = None,
    grace: float | None = None,
) -> Ending:
    """Stop whatever still runs (the ps above all; `grace`: as `down --grace`), record how the
    run ended, and tell the `notify:` commands (through `notifier`, which the caller closes;
    else waiting for them here). A run ended already keeps the words of its first end (a `down`
    answered, then the SIGTERM of the allocation it released), and nobody is told twice."""
    report, backend = stop_run(store, cluster, grace, outcome.silent)
    ended_at = backend_for(cluster.record.backend).clock.time()
    record = cluster.apply(store, transitions.end_if_active(outcome.state, outcome.reason, ended_at))
    if record is None:
        close_trackers(store, cluster.record.run_id, say_to_stderr)
        return Ending(outcome, report, cluster.record, backend)
    if notifier is not None:
        notifier.tell(record, Notify.of_end(outcome))
        close_trackers(store, record.run_id, say_to_stderr)
    else:
        with Notifier.of(record) as own:
            own.tell(record, Notify.of_end(outcome))
            close_trackers(store, record.run_id, say_to_stderr)
    return Ending(outcome, report, record, backend)


def attach(
    store: RunStore,
    cluster: Cluster,
    on_lines: Callable[[list[tuple[str, str]]], None],
    on_restarted: Callable[[set[str]], None] = lambda _names: None,
    stopping: Cancel | None = None,
    hand_over: Callable[[], str | None] = lambda: None,
) -> Ending:
    """Stream every task's output until the job is decided, then stop the rest of the cluster.
    Tasks that start anew (a move, a new allocation) are followed from their new start, and
    `on_restarted` hears of them before their first new line.

    `stopping` is the run's one cancel token: set (Ctrl-C or SIGTERM at the caller's edge, a
    `down` through the door), the run ends stopped with its reason, its last lines read as for
    any end; unless `hand_over` says, in words, that the next allocation's controller takes the
    run up instead. A KeyboardInterrupt (a second Ctrl-C) propagates with the run as it is.
    """
    from tfctl.cluster.output import LogFollower
    from tfctl.controller.live.rpc_handlers import controller_door

    following = _Following(LogFollower(cluster, cluster.record.tasks, follow=True))
    notifier = Notifier.of(cluster.record)
    decided: list[Outcome] = []
    stopping = stopping or Cancel()
    handover = DownHandover(stopping)  # a `down` through the door: this thread stops the run

    def watch() -> None:
        try:
            decided.append(supervise_through_allocations(store, cluster, notifier, stopping, following))
        except TfctlError as e:
            decided.append(Outcome(RunState.FAILED, e.message))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    door = controller_door(store, cluster, handover.ask)
    door.open()
    try:
        while True:
            for batch in following.follower.batches():
                on_lines(batch)
                following.serve()
                if decided or not watcher.is_alive():
                    break
            while not decided and not following.ready and watcher.is_alive():
                following.serve()
                time.sleep(0.05)  # every stream ended: the tasks are over, or about to start anew
            if not following.ready:
                break  # decided, or the supervision thread is gone
            for batch in following.follower.batches():  # the last lines of the stopped tasks, then it ends
                on_lines(batch)
            again = following.follow_again(cluster)
            on_restarted(again)
        follower = following.follower
        outcome = decided[0] if decided else Outcome(RunState.FAILED, "supervision ended")
        if stopping.is_set() and not handover.asked:
            said = hand_over()
            if said is not None:
                return Ending(outcome, StopReport(), cluster.record, handed_over=said)
        ending = finish(store, cluster, outcome, notifier, handover.grace)
        handover.answer(ending.stop, ending.backend)  # a `down` arriving meanwhile hears what was stopped
        # The lines still on their way from the hosts that were stopped; a host that could not be
        # reached sends no end, and its last read is not waited for past READ_REST_PATIENCE.
        silent = bool(ending.stop.unreachable or ending.stop.lost_silent)
        drain_until = time.monotonic() + (UNREACHABLE_DRAIN_SECONDS if silent else LOG_DRAIN_SECONDS)
        finishing = True
        for batch in follower.batches():
            on_lines(batch)
            if finishing and time.monotonic() > drain_until:
                # Tasks that never started send no end: read what is left, once.
                if silent:
                    follower.read_rest(READ_REST_PATIENCE)
                else:
                    follower.finish()
                finishing = False
        return ending
    finally:
        handover.answer(None, None)  # ended without a stop (detached, handed over): a waiting `down` stops it
        door.close()
        stopping.set("the attached `up` ended")
        following.follower.close()
        notifier.close()


class _Following(Restarting):
    """An attached `up`'s log follower, replaced when tasks start anew. Before they start, it
    reads what they printed last and stops (their new output is no continuation of it); once
    they have started, and no other start is under way, a new one follows them from their start
    and the other tasks on from where it was. The follower is only ever used by the thread that
    streams (`serve` does the reading asked for by the supervision thread's `before`)."""

    def __init__(self, follower: LogFollower) -> None:
        self.follower = follower
        self._started: set[str] = set()
        self._pending = 0  # starts under way: told `before`, not yet `after`
        self._lock = threading.Lock()
        self._rest_asked, self._rest_read = threading.Event(), threading.Event()

    def before(self, names: Iterable[str]) -> None:
        with self._lock:
            self._pending += 1
        self._rest_read.clear()
        self._rest_asked.set()
        self._rest_read.wait(READ_REST_PATIENCE + 5)  # a streaming thread that does not answer is not waited for

    def after(self, names: Iterable[str]) -> None:
        with self._lock:
            self._pending -= 1
            self._started.update(names)

    def serve(self) -> None:
        """On the streaming thread: the last read `before` asked for, if it did."""
        if self._rest_asked.is_set():
            self._rest_asked.clear()
            if not self.follower.abandoned:  # (a second start before the first's tasks were followed anew)
                self.follower.read_rest(READ_REST_PATIENCE)
            self._rest_read.set()

    @property
    def ready(self) -> bool:
        with self._lock:
            return bool(self._started) and not self._pending

    def follow_again(self, cluster: Cluster) -> set[str]:
        """Follow with a new follower, if ready; the tasks followed from their new start."""
        from tfctl.cluster.output import LogFollower

        with self._lock:
            if not self._started or self._pending:
                return set()
            again, self._started = self._started, set()
        offsets = {name: at for name, at in self.follower.offsets.items() if name not in again}
        self.follower = LogFollower(cluster, cluster.record.tasks, follow=True, offsets=offsets)
        return again


def supervise_through_allocations(
    store: RunStore,
    cluster: Cluster,
    notifier: Notifier,
    cancel: Cancel,
    restarting: Restarting | None = None,
) -> Outcome:
    """Supervise until decided; an allocation ended under the run by its time limit or by
    preemption moves it into a new one (`resubmit.carry_on`) and supervision goes on there.
    `restarting` hears of tasks started anew (moved, restarted with them, a new allocation's)."""
    restarting = restarting or Restarting()
    carry_out = reconciling.carrier(store, cluster, notifier)
    clock = backend_for(cluster.record.backend).clock
    mover = Mover(store, cluster, carry_out, restarting, clock)
    for host in cluster.record.lost_hosts:  # left while an earlier controller watched: asked to stop as the rest
        cluster.leave(host.name)
    from tfctl.tf.progress import RunProgress

    while True:
        progress = RunProgress(cluster.record.progress)
        outcome = control.supervise(
            cluster,
            reconciling.rules_of(cluster, progress),
            carry_out,
            on_lost=mover,
            closer_look=reconciling.closer_look(cluster, progress),
            allocation_end=reconciling.allocation_end(cluster),
            cancel=cancel,
            clock=clock,
        )
        if cancel.is_set():
            return outcome
        ending = carry_on(store, cluster, outcome, carry_out, restarting)
        if ending is not None:
            return ending


def launch_and_watch(store: RunStore, run: Draft, accept_new_host_keys: bool, report: Report) -> Ending | None:
    """Body of the watcher that `up -d` forks first: start the run (its progress, then
    `running`, or the error, go to `report`, which `up -d` prints), then watch it with the same
    connections, so no host is connected to twice. SIGTERM during the start is `up -d`'s Ctrl-C:
    everything started is stopped."""

    started, stopping = threading.Event(), Cancel()

    def on_sigterm(*_: object) -> None:  # one handler, so no SIGTERM falls between two
        if not started.is_set():
            raise KeyboardInterrupt
        stopping.set("SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        cluster = launch(
            store,
            run,
            lambda who, message: report({"progress": [who, message]}),
            accept_new_host_keys,
            detach=True,
            watcher=controller_of_this_process(ControllerKind.WATCHER),
        )
    except KeyboardInterrupt:
        report({"interrupted": True})
        return None
    except TfctlError as e:
        report({"error": e.message, "hint": e.hint, "exit_code": e.exit_code, "kind": type(e).__name__})
        return None
    started.set()
    report({"running": True})
    with cluster:
        return _watch(store, cluster, stopping)


def watch(store: RunStore, run_id: str) -> Ending | None:
    """Body of a watcher started for a running run (`up -d` that waited to acquire hosts, or a controller that
    died): supervise until decided, then stop the run."""
    record = store.load(run_id)
    if not record.active:
        return None
    stopping = Cancel()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set("SIGTERM"))
    with Cluster(record) as cluster:
        return _watch(store, cluster, stopping)


def _watch(store: RunStore, cluster: Cluster, stopping: Cancel) -> Ending | None:
    """Supervise until decided, then stop the run. `stopping` (SIGTERM) ends it without
    stopping anything; a `down` through its door stops the run with its connections."""
    from tfctl.controller.live.rpc_handlers import controller_door

    handover = DownHandover(stopping)
    with controller_door(store, cluster, handover.ask), Notifier.of(cluster.record) as notifier:
        try:
            outcome = supervise_through_allocations(store, cluster, notifier, stopping)
            cancelled = stopping.is_set()  # else the job decided, and a `down` arriving now hears what was stopped
            if cancelled and not handover.asked:
                return None  # SIGTERM: another `down` takes over, or the machine shuts down
            ending = finish(store, cluster, STOPPED_BY_DOWN if cancelled else outcome, notifier, handover.grace)
            handover.answer(ending.stop, ending.backend)  # before the notify commands end: `down` waits for it
            return None if cancelled else ending  # a watcher told to stop by `down` has no outcome of its own
        finally:
            handover.answer(None, None)


class DownHandover:
    """A `down` that reached the run's controller through its door. The door's thread waits while
    the controller's own thread ends supervision and then stops the run, so the two never race
    (over which stops it, and over the words its record keeps)."""

    def __init__(self, stopping: Cancel) -> None:
        self._stopping = stopping
        self.asked = False
        self.grace: float | None = None  # the `down --grace` asked for (None: the run's own)
        self._done = threading.Event()
        self._result: tuple[StopReport | None, BackendReport | None] = (None, None)

    def ask(self, grace: float | None) -> tuple[StopReport | None, BackendReport | None]:
        if not self._done.is_set():
            self.grace, self.asked = grace, True
            self._stopping.set(STOPPED_BY_DOWN.reason)
            self._done.wait()
        return self._result

    def answer(self, report: StopReport | None, job: BackendReport | None) -> None:
        """What was stopped, once; (None, None): the controller ends without stopping anything,
        and the `down` stops the run itself."""
        if not self._done.is_set():
            self._result = (report, job)
            self._done.set()


def _being_stopped(record: RunRecord) -> bool:
    """A `down` is stopping the run (it stopped the watcher first): the down records the end."""
    since = record.stopping_since
    return since is not None and time.time() - since < record.grace_period + STOP_PATIENCE


def resume(store: RunStore, record: RunRecord) -> str | None:
    """A run whose controller died is decided at once if its job already ended while nobody
    watched (so this first answer is as true as the next one), else gets a new watcher, so it
    still ends when its job does. The sentence to tell the user, or None when nothing was amiss."""
    w = record.watcher
    if w is None or not watcher.controller_gone(record) or _being_stopped(record):
        return None
    was = f"the `tfctl up` that started it (pid {w.pid})" if w.attached else f"its watcher (pid {w.pid})"
    if record.state is RunState.STARTING:  # nobody can finish a start cut off halfway: end it
        record = transitions.apply(store, record.run_id, transitions.mark_cut_off()) or record
        with Cluster(record) as cluster:
            cut = finish(store, cluster, Outcome(RunState.FAILED, f"{was} died during the start")).record
        return f"run {record.run_id}: {was} died during the start: what it started is stopped; recorded as {cut.state}"
    ended = _decided_already(store, record)
    if ended is not None:
        how = f"{ended.state.value} ({ended.reason})"
        return f"run {record.run_id}: {was} is gone, and its job had ended: recorded as {how}"
    fresh = watcher.spawn_watcher(store, record)
    lease = (
        f"; its tasks stop on their hosts {record.lease_timeout:g}s after their controller (lease_timeout)"
        if w.attached and record.lease_timeout
        else ""
    )
    pid = fresh.watcher.pid if fresh.watcher is not None else None
    return f"run {record.run_id}: {was} is gone; a new watcher (pid {pid}) supervises it{lease}"


def _decided_already(store: RunStore, record: RunRecord) -> RunRecord | None:
    """The run ended as its new watcher would end it at its first look (every host answered and
    the tasks decide the job), or None while the job goes on or a host is silent."""
    with Cluster(record) as cluster:
        statuses, unreachable = cluster.status()
        outcome = None if unreachable else decide(statuses, record.decisive, record.essential)
        if outcome is None:
            return None
        return finish(store, cluster, outcome).record
