"""Every change to a run's record, by name: the one writer of run.json.

A `Transition` is a named, guarded change of a record: pure (`Transition.on` gives the new record,
or None where its guard refuses), so the transitions are tested as a table, the races among them
included. `apply` carries one out on the store under its lock, so of two at once (two `down`s, a
`down` against the run's own end, a resubmission against a `down`) the first holds and the second
is judged against what the first made. Holders of a copy of the record (`Cluster.apply`) take the
stored result, so the copy and the store never diverge.

The store's own writes (`RunStore.create`, `save`, `forget`) are called from here alone;
`tests/test_transitions.py` fails on a write of a record anywhere else in tfctl.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any, Callable, Mapping

from tfctl.errors import UsageError
from tfctl.runs.record import AllocationEnd, Controller, HostSpec, Move, RunRecord, TaskSpec, TrackerRun
from tfctl.runs.store import CLUSTER_FILE, RunStore
from tfctl.supervisor.protocol import RunState


class Guard(enum.Enum):
    """Which records a transition may change."""

    ACTIVE = "active"  # a run nobody has ended yet: an ended run keeps what its end said
    RECORDED = "recorded"  # any run still recorded, ended or not (figures kept after the stop)
    QUEUED = "queued"  # a run still waiting in its queue: of a start and a cancel, the first holds
    UNSTARTED = "unstarted"  # taken from its queue, no watcher ever given it: nothing of it runs
    TRACKER_OPEN = "tracker open"  # ended, its tracker runs not told yet: of two who would tell, the first does

    def admits(self, record: RunRecord) -> bool:
        if self is Guard.QUEUED:
            return record.state is RunState.QUEUED
        if self is Guard.TRACKER_OPEN:
            return record.state.is_final and any(not link.closed for link in record.tracking)
        if self is Guard.UNSTARTED:
            return record.state is RunState.STARTING and record.watcher is None and record.pool is not None
        return record.active or self is Guard.RECORDED


@dataclasses.dataclass(frozen=True)
class Transition:
    """One named change of a record, and the records it applies to."""

    name: str
    guard: Guard
    change: Callable[[RunRecord], RunRecord] = dataclasses.field(compare=False)

    def on(self, record: RunRecord) -> RunRecord | None:
        """The record after this transition; None where the guard refuses it."""
        return self.change(record) if self.guard.admits(record) else None


def apply(store: RunStore, run_id: str, transition: Transition) -> RunRecord | None:
    """Carry out `transition` on the stored record, under the store's lock: the new record, or
    None for a run no longer recorded (forgotten) or one the guard refuses (ended meanwhile)."""
    with store.lock():
        if not store.exists(run_id):
            return None
        changed = transition.on(store.load(run_id))
        if changed is not None:
            store.save(changed)
        return changed


def claim(store: RunStore, record: RunRecord, cleared: str | None) -> RunRecord:
    """Record a new run as its cluster file's live run, deciding atomically against a concurrent
    `up` of the same file: whichever records first starts, the other is refused. `cleared`: the
    run found over before (`ensure_no_live_run`), which may still say running."""
    with store.lock():
        latest = store.latest(Path(record.cluster_file), record.trial_of, queued_too=False)
        if latest is not None and latest.active and latest.run_id not in (record.run_id, cleared):
            raise UsageError(
                f"run {latest.run_id} of cluster {record.cluster_name!r} was started by another `tfctl up` "
                "at the same moment",
                hint=f"stop it first: tfctl -f {record.cluster_file} down --run {latest.run_id}",
            )
        store.create(record)  # first: whatever follows leaves files on the hosts, for `prune`
    return record


def submit(store: RunStore, record: RunRecord, source: str) -> RunRecord:
    """A queued run recorded, its cluster file kept as submitted (an edit after `submit` must not
    change it) and marked for its queue (`RunStore.queued_ids`, which a queue's driver reads)."""
    assert record.state is RunState.QUEUED
    with store.lock():
        store.create(record)
        keep_cluster_file(store, record.run_id, source)
        store.mark_queued(record.run_id, True)
    return record


def take_from_queue(started: RunRecord) -> Transition:
    """The queued run as its start recorded it (placed: its tasks and hosts), keeping what the
    submit said (when, at what priority, the trial it is, the run it resumes); refused once it
    was cancelled."""

    def change(r: RunRecord) -> RunRecord:
        return started.replace(
            created_at=r.created_at,
            priority=r.priority,
            pool=r.pool,
            resumes=r.resumes,
            sweep=r.sweep,
            trial=r.trial,
            state=RunState.STARTING,
        )

    return Transition("take from the queue", Guard.QUEUED, change)


def cancel_queued(at: float) -> Transition:
    """A queued run taken out before it started: nothing of it ran anywhere. Refused once started."""
    return Transition(
        "cancel while queued",
        Guard.QUEUED,
        lambda r: r.replace(state=RunState.STOPPED, reason="cancelled while queued", ended_at=at, left_nothing=True),
    )


def back_to_queue() -> Transition:
    """A run its queue's driver took but died before it started its watcher: nothing of it ran
    anywhere, so it waits again, where it was in the queue (its submission time is kept)."""
    return Transition(
        "back to the queue",
        Guard.UNSTARTED,
        lambda r: r.replace(state=RunState.QUEUED, tasks=(), hosts=(), placement=()),
    )


def rejoin_queue(store: RunStore, run_id: str) -> None:
    """The queue's mark again, for a run back in the queue."""
    store.mark_queued(run_id, True)


def leave_queue(store: RunStore, run_id: str) -> None:
    """The queue's mark of a run that started or ended: its driver looks at it no more."""
    store.mark_queued(run_id, False)


def forget(store: RunStore, run_id: str) -> None:
    """Remove a run's record and what was kept beside it: a start that failed before it put
    anything on a host, or a run `runs --prune` found nothing left of."""
    store.forget(run_id)


def keep_cluster_file(store: RunStore, run_id: str, text: str) -> None:
    """The cluster file as the run started from it, kept once, for whatever re-plans the run
    later (a resubmission): an edited file must not change a running run."""
    kept = store.run_dir(run_id) / CLUSTER_FILE
    if text and not kept.exists():
        kept.write_text(text, encoding="utf-8")
        kept.chmod(0o600)


def take_control(watcher: Controller | None, lease_timeout: float | None = None) -> Transition:
    """The process that controls the run from now (an attached `up`, a watcher, the controller
    of a new allocation), and the lease it holds, if it says."""

    def change(r: RunRecord) -> RunRecord:
        return (
            r.replace(watcher=watcher)
            if lease_timeout is None
            else r.replace(watcher=watcher, lease_timeout=lease_timeout)
        )

    return Transition("take control", Guard.ACTIVE, change)


def record_plan(tasks: tuple[TaskSpec, ...], essential: tuple[str, ...], versions: Mapping[str, str]) -> Transition:
    """The tasks as placed on the hosts that answered preflight, and the versions they run."""
    kept = dict(versions)
    return Transition(
        "record the plan", Guard.RECORDED, lambda r: r.replace(tasks=tasks, essential=essential, versions=kept)
    )


def mark_running() -> Transition:
    """Every task started; a `down` that ended the run meanwhile keeps its end."""
    return Transition("mark running", Guard.ACTIVE, lambda r: r.replace(state=RunState.RUNNING))


def note_unreachable(since: Mapping[str, float]) -> Transition:
    """The hosts the controller cannot reach, and since when (epoch seconds), for `status`."""
    return Transition("note unreachable hosts", Guard.RECORDED, lambda r: r.replace(unreachable=dict(since)))


def record_move(lost: str, spare: str, tasks: tuple[TaskSpec, ...], moves: tuple[Move, ...]) -> Transition:
    """The lost host's tasks on the spare: the lost host leaves the run's hosts for its lost ones
    (to be stopped once it answers), and the spare is a spare no more."""

    def change(r: RunRecord) -> RunRecord:
        return r.replace(
            tasks=tasks,
            hosts=tuple(h for h in r.hosts if h.name != lost),
            lost_hosts=r.lost_hosts + tuple(h for h in r.hosts if h.name == lost),
            spares=tuple(h for h in r.spares if h != spare),
            moves=r.moves + moves,
        )

    return Transition("record a move", Guard.RECORDED, change)


def retire_host(host: str) -> Transition:
    """A lost host answered again and stopped what the run left there: nothing to wait for."""
    return Transition(
        "retire a lost host",
        Guard.RECORDED,
        lambda r: r.replace(lost_hosts=tuple(h for h in r.lost_hosts if h.name != host)),
    )


def note_hand_over(backend_state: Mapping[str, Any]) -> Transition:
    """The allocation ends under the run and a successor takes it up: the backend's state says so."""
    return Transition("note a hand-over", Guard.ACTIVE, lambda r: r.replace(backend_state=dict(backend_state)))


def record_allocation(
    hosts: tuple[HostSpec, ...], backend_state: Mapping[str, Any] | None, ended: AllocationEnd
) -> Transition:
    """The run on the hosts of a new allocation, starting again; the one before ended as `ended`."""

    def change(r: RunRecord) -> RunRecord:
        state = None if backend_state is None else dict(backend_state)
        return r.replace(hosts=hosts, backend_state=state, allocations=(*r.allocations, ended), state=RunState.STARTING)

    return Transition("record an allocation", Guard.ACTIVE, change)


def mark_cut_off() -> Transition:
    """Its start was cut off by its controller's death (a sweep starts such a trial again)."""
    return Transition("mark the start cut off", Guard.ACTIVE, lambda r: r.replace(cut_off=True))


def begin_stop(at: float) -> Transition:
    """A `down` is stopping the run: its watcher dying now is the down's doing, not a cut-off
    start for `driver.resume` to end as failed."""
    return Transition("begin the stop", Guard.ACTIVE, lambda r: r.replace(stopping_since=at))


def end_if_active(state: RunState, reason: str, at: float) -> Transition:
    """How the run ended, and when; of two ends at once (a `down` and a start that fails, a
    `down` and the run's own end) the first one's words stay."""
    return Transition("end", Guard.ACTIVE, lambda r: r.replace(state=state, reason=reason, ended_at=at))


def record_stop(
    left_nothing: bool, lost_hosts: tuple[HostSpec, ...], accounting: Any, result: Mapping[str, Any] | None = None
) -> Transition:
    """What a stop proved (nothing left, or the lost hosts still silent), what the run cost and
    its result (None: no host could say)."""
    kept = None if result is None else dict(result)
    return Transition(
        "record the stop",
        Guard.RECORDED,
        lambda r: r.replace(left_nothing=left_nothing, lost_hosts=lost_hosts, accounting=accounting, result=kept),
    )


def link_trackers(links: tuple[TrackerRun, ...]) -> Transition:
    """The tracker runs the run logs into, made or taken on at its start; kept also if a `down`
    ended the run meanwhile, so that its trackers are told of that end."""
    return Transition("link trackers", Guard.RECORDED, lambda r: r.replace(tracking=tuple(links)))


def close_trackers() -> Transition:
    """The ended run's tracker runs are being told of its end: by this caller alone."""
    return Transition(
        "close trackers",
        Guard.TRACKER_OPEN,
        lambda r: r.replace(tracking=tuple(link.replace(closed=True) for link in r.tracking)),
    )


def tracking_missed(missed: Mapping[str, tuple[str, ...]]) -> Transition:
    """What each tracker (by kind) could not be told of the end."""
    return Transition(
        "record what trackers missed",
        Guard.RECORDED,
        lambda r: r.replace(tracking=tuple(link.replace(missed=missed.get(link.kind, ())) for link in r.tracking)),
    )


def record_accounting(accounting: Mapping[str, Any] | None) -> Transition:
    """The run's cost figures, tfctl's and its scheduler's, as they stand."""
    figures = None if accounting is None else dict(accounting)
    return Transition("record accounting", Guard.RECORDED, lambda r: r.replace(accounting=figures))


def settle_scheduler_figures(backend: str, figures: Any) -> Transition:
    """The scheduler's final figures for an ended run, beside tfctl's own."""
    return Transition(
        "settle scheduler figures",
        Guard.RECORDED,
        lambda r: r.replace(accounting={**(r.accounting or {}), backend: figures}),
    )
