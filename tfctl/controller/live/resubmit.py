"""A run that outlives its allocation: when the scheduler ends it by its time limit or by
preemption (not `down`, not a task's own failure), the backend asks for a new one, up to the
run's `resubmits`, and the same run (same id, same $TFCTL_RUN_DIR) starts again there: its
tasks, re-planned for the new hosts, resume from the checkpoints they saved.

A controller that lives inside its allocation dies with it: it hands the run over instead
(`hand_over`, on the SIGTERM of the allocation's end), and the controller of the successor
allocation its backend queued beforehand takes it up (`take_up`). Whether the run goes on is
decided in `engine.resubmission` either way; this module carries it out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from tfctl.backends.base import backend_for
from tfctl.cluster import pooling
from tfctl.cluster.cluster import Cluster, Progress
from tfctl.config.loader import load_config, parse_config
from tfctl.config.model import ClusterConfig
from tfctl.controller.live.launch import start_again
from tfctl.controller.live.notify import Notifier
from tfctl.controller.live.restarting import Restarting
from tfctl.controller.live.stopping import release
from tfctl.controller.live.tracked import close_trackers, say_to_stderr
from tfctl.controller.live.watcher import controller_lives, controller_of_this_process
from tfctl.controller.start.plan import Draft, drafted
from tfctl.engine import resubmission
from tfctl.engine.clock import REAL_CLOCK, Clock
from tfctl.engine.events import EventKind
from tfctl.engine.reconcile import Action, Notify, Say
from tfctl.engine.resubmission import Finish, Resubmit, Seen
from tfctl.engine.verdicts import Outcome
from tfctl.errors import TfctlError
from tfctl.runs import transitions
from tfctl.runs.record import AllocationEnd, ControllerKind, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState

GAP_POLL = 2.0  # seconds between two looks at a run between its allocations


def carry_on(
    store: RunStore,
    cluster: Cluster,
    outcome: Outcome,
    carry_out: Callable[[Action], None],
    restarting: Restarting,
) -> Outcome | None:
    """None once the run goes on in a new allocation (`cluster` moved onto it, its tasks
    started, `restarting` told before and after); else how the run ends: `outcome`, or why
    going on failed. What to do is `engine.resubmission`'s to decide; this carries it out, its
    lines and its `resubmitted` event through the live run's `carry_out`."""
    record = store.load(cluster.record.run_id)
    seen = Seen(outcome, record.active, len(record.allocations), record.resubmits)
    early = resubmission.worth_asking(seen)
    if early is not None:
        return early.outcome

    def progress(who: str, message: str) -> None:
        carry_out(Say(f"[{who}] {message}" if who else message))

    try:
        config = recorded_config(store, record)  # read before anything is asked for
        over = backend_for(record.backend).why_over(record, progress)
        decision = resubmission.decide(dataclasses.replace(seen, over=over))
        if isinstance(decision, Finish):
            return decision.outcome
        moved = _into_new_allocation(store, record, config, decision, outcome, progress)
        if isinstance(moved, Finish):
            return moved.outcome
        run, said = moved
        carry_out(Notify(EventKind.RESUBMITTED, said))
        names = [t.name for t in run.record.tasks]
        restarting.before(names)
        try:
            start_again(store, cluster, run, progress)
        finally:  # started or failed, what they printed is theirs to show
            restarting.after(names)
    except TfctlError as e:
        return Outcome(RunState.FAILED, e.message.splitlines()[0])
    return None


def take_up(store: RunStore, run_id: str, progress: Progress) -> Cluster | Outcome:
    """The controller of a successor allocation (queued by the controller before, which died
    with its allocation): the same run started again here, as the cluster this controller then
    follows, attached; or how the run ended, nothing started: ended already (a `down`), or now,
    its allocation having ended in a way the run does not go on after (a cancel)."""
    record = store.load(run_id)
    backend = backend_for(record.backend)
    seen = Seen(None, record.active, len(record.allocations), record.resubmits)
    decision = resubmission.worth_asking(seen) or resubmission.decide(
        dataclasses.replace(seen, over=backend.why_over(record, progress))
    )
    if isinstance(decision, Finish):
        end = transitions.end_if_active(decision.outcome.state, decision.outcome.reason, backend.clock.time())
        ended = None if decision.recorded else transitions.apply(store, run_id, end)
        if ended is not None:
            with Notifier.of(ended) as notifier:
                notifier.tell(ended, Notify.of_end(Outcome(ended.state, decision.outcome.reason)))
        close_trackers(store, run_id, say_to_stderr)
        return decision.outcome
    moved = _into_new_allocation(store, record, recorded_config(store, record), decision, None, progress)
    if isinstance(moved, Finish):
        return moved.outcome
    run, said = moved
    with Notifier.of(run.record) as notifier:
        notifier.tell(run.record, Notify(EventKind.RESUBMITTED, said))
    mine = run.record.replace(watcher=controller_of_this_process(ControllerKind.UP))
    cluster = Cluster(mine, holds_lease=True, launcher=backend.monitor_launcher(mine))
    try:
        cluster.apply(store, transitions.take_control(mine.watcher))
        start_again(store, cluster, run, progress)
    except BaseException:
        cluster.close()
        release(cluster.record)
        raise
    return cluster


def hand_over(store: RunStore, cluster: Cluster) -> str | None:
    """The run's controller told to end (SIGTERM): when its allocation ends under the run and a
    successor is queued to take it up (`Backend.hand_over`), record that and say so, stopping
    nothing; None: stop the run as for any SIGTERM."""
    record = store.load(cluster.record.run_id)
    state = backend_for(record.backend).hand_over(record) if record.active else None
    if state is None or transitions.apply(store, record.run_id, transitions.note_hand_over(state)) is None:
        return None
    return "the allocation ends under the run; the controller of the next one takes it up"


def next_allocation(store: RunStore, record: RunRecord, clock: Clock = REAL_CLOCK) -> RunRecord | None:
    """For a follower whose tasks ended under a run that may go on in a new allocation (`logs
    -f`): the run's record once its tasks run there; None once it is over, or nobody is left to
    take it up (no live controller here, no allocation or successor job left)."""
    if len(record.allocations) >= record.resubmits:
        return None
    backend = backend_for(record.backend)
    while True:
        now = store.load(record.run_id)
        if not now.active:
            return None
        if len(now.allocations) > len(record.allocations) and now.state is RunState.RUNNING:
            return now
        if not controller_lives(now) and backend.is_over(now):
            return None
        clock.sleep(GAP_POLL)


def _into_new_allocation(
    store: RunStore,
    record: RunRecord,
    config: ClusterConfig,
    decision: Resubmit,
    outcome: Outcome | None,
    progress: Progress,
) -> tuple[Draft, str] | Finish:
    """Ask for the new allocation and record the run on it, with the end of the one before: the
    run drafted there, and the words for it; or, a `down` having come meanwhile, how it ends."""
    backend = backend_for(record.backend)
    held = backend.report(record)
    end = AllocationEnd(held.label if held else record.backend, backend.clock.time(), decision.why)
    progress(backend.name, "asking for a new allocation for the run")
    acquired = backend.acquire(config, record.run_id, progress)
    run = drafted(acquired.config, store, record.run_id, acquired.state)
    moved = transitions.apply(
        store, record.run_id, transitions.record_allocation(run.record.hosts, run.record.backend_state, end)
    )
    done = resubmission.once_acquired(outcome, still_active=moved is not None)
    if done is not None:  # a `down` ended it while the new allocation was asked for
        if done.release_new:
            backend.release(run.record)
        return done
    assert moved is not None  # (the engine goes on only with the run still active)
    said = f"{end.label} ended: {end.why}; the run goes on in allocation {decision.allocation}"
    progress("", said)
    return Draft(acquired.config, moved), said


def recorded_config(store: RunStore, record: RunRecord) -> ClusterConfig:
    """The run's configuration as it started: the cluster file it kept, not the file as it is now
    (edited hours later, it would change the resubmitted run), with the parameters it ran with.
    A run kept none before tfctl kept them: its file as it is."""
    kept = store.kept_cluster_file(record.run_id)
    path = Path(record.cluster_file)
    texts = record.param_texts
    params = {name: (value, texts.get(name, str(value))) for name, value in record.params.items()} or None
    config = load_config(path, params) if kept is None else parse_config(kept, path, params)
    return pooling.placed_again(config, record.placement) if record.placement else config
