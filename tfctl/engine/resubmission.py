"""Whether a run goes on in a new allocation once its allocation ended under it, decided from
what was observed: the run record (still active, or ended by a `down`; how many allocations it
outlived of the `resubmits` it may), how its tasks ended, and the backend's word on why the
allocation ended. No I/O: `controller.live.resubmit` asks the backend and carries the decision
out, and a controller that starts in a successor allocation (its batch job's, submitted by the one before)
asks the same question with no outcome, the controller that saw the end having died with it.

A decision is taken in up to three steps, each on what the step before could not know:
`worth_asking` (without the backend), `decide` (with its word), and `once_acquired` (after the
new allocation was granted: a `down` may have come while it was asked for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from tfctl.engine.verdicts import STOPPED_BY_DOWN, Outcome
from tfctl.supervisor.protocol import RunState


@dataclass(frozen=True)
class AllocationOver:
    """The backend's word on the allocation's end: in the scheduler's words (TIMEOUT, PREEMPTED,
    CANCELLED), and whether the run may go on after it (a time limit or preemption of an
    allocation tfctl asked for)."""

    why: str
    continues: bool


@dataclass(frozen=True)
class Seen:
    """What the decision is taken on. `outcome`: how the run's tasks ended, None when its
    controller died with the allocation and nobody saw; `active`: no end is recorded yet (a
    `down` records one); `ended`: allocations the run outlived so far; `over`: None while the
    allocation holds (the tasks ended by themselves) or before the backend was asked."""

    outcome: Outcome | None
    active: bool
    ended: int
    resubmits: int
    over: AllocationOver | None = None


@dataclass(frozen=True)
class Resubmit:
    """Go on in a new allocation, the run's `allocation`-th; `why`: the last one's end."""

    why: str
    allocation: int


@dataclass(frozen=True)
class Finish:
    """The run ends with `outcome`. `recorded`: the record says how already (a `down` came
    first): write nothing. `release_new`: a new allocation was granted meanwhile: give it back."""

    outcome: Outcome
    recorded: bool = False
    release_new: bool = False


Decision = Union[Resubmit, Finish]

UNSEEN = Outcome(RunState.FAILED, "the run's controller ended with its allocation")


def worth_asking(seen: Seen) -> Finish | None:
    """The decision when the backend's word cannot change it (a success, a `down`, no
    resubmission left); None: ask the backend why the allocation ended, then `decide`."""
    if not seen.active:
        return Finish(seen.outcome or STOPPED_BY_DOWN, recorded=True)
    if seen.outcome is not None and seen.outcome.succeeded:
        return Finish(seen.outcome)
    if seen.ended >= seen.resubmits:
        return Finish(_without(seen, "no resubmission left"))
    return None


def decide(seen: Seen) -> Decision:
    """Resubmit after a time limit or preemption of tfctl's own allocation, while resubmissions
    are left and no `down` ended the run; otherwise end it as its tasks decided (or, unseen, as
    its allocation ended)."""
    early = worth_asking(seen)
    if early is not None:
        return early
    if seen.over is None or not seen.over.continues:
        return Finish(_without(seen, f"its allocation ended: {seen.over.why}" if seen.over else ""))
    return Resubmit(seen.over.why, seen.ended + 2)


def once_acquired(outcome: Outcome | None, still_active: bool) -> Finish | None:
    """After the new allocation was granted: None to start the run there; a `down` that came
    while it was asked for ends the run as recorded, and the new allocation goes back."""
    if still_active:
        return None
    return Finish(outcome or STOPPED_BY_DOWN, recorded=True, release_new=True)


def _without(seen: Seen, why: str) -> Outcome:
    """The run's end when it does not go on: as its tasks decided; unseen, its allocation's."""
    if seen.outcome is not None:
        return seen.outcome
    return Outcome(RunState.FAILED, UNSEEN.reason + (f"; {why}" if why else ""))
