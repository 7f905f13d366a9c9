"""A run that outlives its allocation: when the scheduler ends it by its time limit or by
preemption (not `down`, not a task's own failure), the backend asks for a new one, up to the
run's `resubmits`, and the same run (same id, same $TFCTL_RUN_DIR) starts again there: its
tasks, re-planned for the new hosts, resume from the checkpoints they saved.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from tfctl.backends.base import backend_for
from tfctl.cluster.supervisors import Cluster
from tfctl.config.loader import load_config, parse_config
from tfctl.config.model import ClusterConfig
from tfctl.controller.live.notify import EventKind, Notifier, RunEvent
from tfctl.controller.live.restarting import Restarting
from tfctl.controller.start.plan import Draft
from tfctl.controller.verbs.up import drafted, start_again
from tfctl.engine import resubmission
from tfctl.engine.resubmission import Finish, Seen
from tfctl.engine.verdicts import Outcome
from tfctl.errors import TfctlError
from tfctl.runs.record import AllocationEnd, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState


def carry_on(
    store: RunStore, cluster: Cluster, outcome: Outcome, notifier: Notifier, restarting: Restarting
) -> Outcome | None:
    """None once the run goes on in a new allocation (`cluster` moved onto it, its tasks
    started, `restarting` told before and after); else how the run ends: `outcome`, or why
    going on failed. What to do is `engine.resubmission`'s to decide; this carries it out."""
    run_id = cluster.record.run_id
    record = store.load(run_id)
    seen = Seen(outcome, record.active, len(record.allocations), record.resubmits)
    early = resubmission.worth_asking(seen)
    if early is not None:
        return early.outcome
    backend = backend_for(record.backend)

    def progress(who: str, message: str) -> None:
        notifier.say(f"[{who}] {message}" if who else message)

    try:
        config = recorded_config(store, record)  # read before anything is asked for
        decision = resubmission.decide(dataclasses.replace(seen, over=backend.why_over(record, progress)))
        if isinstance(decision, Finish):
            return decision.outcome
        held = backend.report(record)
        end = AllocationEnd(held.label if held else record.backend, time.time(), decision.why)
        progress(backend.name, "asking for a new allocation for the run")
        acquired = backend.acquire(config, run_id, progress)
        run = drafted(acquired.config, store, run_id, acquired.state)
        moved = store.update_if_active(
            run_id,
            hosts=run.record.hosts,
            backend_state=run.record.backend_state,
            allocations=(*record.allocations, end),
            state=RunState.STARTING,
        )
        done = resubmission.once_acquired(outcome, still_active=moved is not None)
        if done is not None:  # a `down` ended it while the new allocation was asked for
            if done.release_new:
                backend.release(run.record)
            return done.outcome
        assert moved is not None  # (the engine goes on only with the run still active)
        said = f"{end.label} ended: {end.why}; the run goes on in allocation {decision.allocation}"
        progress("", said)
        notifier.send(RunEvent.of(moved, EventKind.RESUBMITTED, said))
        names = [t.name for t in moved.tasks]
        restarting.before(names)
        try:
            start_again(store, cluster, Draft(acquired.config, moved), progress)
        finally:  # started or failed, what they printed is theirs to show
            restarting.after(names)
    except TfctlError as e:
        return Outcome(RunState.FAILED, e.message.splitlines()[0])
    return None


def recorded_config(store: RunStore, record: RunRecord) -> ClusterConfig:
    """The run's configuration as it started: the cluster file it kept, not the file as it is now
    (edited hours later, it would change the resubmitted run). A run kept none before tfctl kept
    them: its file as it is."""
    kept = store.kept_cluster_file(record.run_id)
    path = Path(record.cluster_file)
    return load_config(path) if kept is None else parse_config(kept, path)
