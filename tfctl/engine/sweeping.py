"""A sweep's decisions: each trial's state from its runs, which trials start next, and when the
sweep is over. Pure: the driver (`controller/verbs/sweep.py`) reads the records, asks `step`,
starts what it says and looks again after `requeue_after`.

A trial's runs are its attempts. One whose start was cut off (its controller died before every
task ran: tfctl's fault, not the trial's) is started again, continuing its files, and costs no
retry; a failed one is started again while `retries` last, also continuing its files; a trial
that could not become a run at all (a start refused) counts as a failed attempt of its own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tfctl.supervisor.states import RunState

LOOK = 1.0  # seconds between two looks at the trials while any runs


class TrialState(str, enum.Enum):
    """One trial's state in its sweep."""

    PENDING = "pending"  # not started yet, or to be started again
    RUNNING = "running"  # its newest run is starting or running
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # its retries spent
    STOPPED = "stopped"  # stopped by a `down` (of the trial's run or of the sweep)

    def __str__(self) -> str:
        return self.value

    @property
    def is_final(self) -> bool:
        return self not in (TrialState.PENDING, TrialState.RUNNING)


@dataclass(frozen=True)
class Attempt:
    """One run of a trial, as its record says."""

    run_id: str
    state: RunState
    cut_off: bool = False  # its start was cut off by its controller's death
    ended_at: float | None = None


@dataclass(frozen=True)
class TrialSeen:
    """A trial as the driver found it: its runs, oldest first, and its refused starts."""

    index: int
    attempts: tuple[Attempt, ...] = ()
    refused: int = 0  # starts that made no run (the error is kept with the sweep)


@dataclass(frozen=True)
class Start:
    """Start trial `index` (again: continuing the files of run `resumes`)."""

    index: int
    resumes: str | None = None


@dataclass(frozen=True)
class SweepStep:
    """What one look decided."""

    states: tuple[TrialState, ...]  # every trial's, in trial order
    start: tuple[Start, ...]
    over: bool  # nothing runs and nothing will start: the sweep ends
    requeue_after: float = LOOK


def trial_state(seen: TrialSeen, retries: int, resumed_at: float | None = None) -> TrialState:
    """A trial's state: its newest run's, a failure given another go while retries last, and
    one stopped before the sweep was resumed (at `resumed_at`) to be started again."""
    last = seen.attempts[-1] if seen.attempts else None
    if last is not None and last.state is RunState.STOPPED and _before(last.ended_at, resumed_at):
        return TrialState.PENDING
    if last is not None and not last.state.is_final:
        return TrialState.RUNNING
    if last is not None and last.state is RunState.SUCCEEDED:
        return TrialState.SUCCEEDED
    if last is not None and last.state is RunState.STOPPED:
        return TrialState.STOPPED
    failures = seen.refused + sum(1 for a in seen.attempts if a.state is RunState.FAILED and not a.cut_off)
    if failures == 0 or failures <= retries:
        return TrialState.PENDING
    return TrialState.FAILED


def step(
    trials: tuple[TrialSeen, ...], max_parallel: int, retries: int, stopping: bool, resumed_at: float | None = None
) -> SweepStep:
    """Start the pending trials in trial order while fewer than `max_parallel` run; none once
    the sweep is stopping, which is over when nothing of it runs any more."""
    states = tuple(trial_state(t, retries, resumed_at) for t in trials)
    running = states.count(TrialState.RUNNING)
    room = 0 if stopping else max(0, max_parallel - running)
    pending = [t for t, s in zip(trials, states) if s is TrialState.PENDING]
    start = tuple(Start(t.index, t.attempts[-1].run_id if t.attempts else None) for t in pending[:room])
    over = running == 0 and (stopping or not pending)
    return SweepStep(states, start, over)


def _before(ended_at: float | None, resumed_at: float | None) -> bool:
    return resumed_at is not None and ended_at is not None and ended_at < resumed_at


def changes(before: tuple[TrialState, ...], after: tuple[TrialState, ...]) -> list[tuple[int, TrialState]]:
    """The trials whose state a look changed, as the follower prints them (all of them at the first)."""
    if not before:
        return [(i, s) for i, s in enumerate(after) if s is not TrialState.PENDING]
    return [(i, s) for i, (was, s) in enumerate(zip(before, after)) if was is not s]
