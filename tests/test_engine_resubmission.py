"""Resubmission's decision (`engine.resubmission`) as tables: what was observed of the run and its
allocation's end, and what the engine decides. No process, no backend: each row is one decision."""

from __future__ import annotations

import pytest

from tfctl.engine.resubmission import (
    UNSEEN,
    AllocationOver,
    Finish,
    Resubmit,
    Seen,
    decide,
    once_acquired,
    worth_asking,
)
from tfctl.engine.verdicts import STOPPED_BY_DOWN, Outcome
from tfctl.supervisor.protocol import RunState

FAILED = Outcome(RunState.FAILED, "worker:0 on n1 was killed by SIGTERM", "worker:0")
SUCCEEDED = Outcome(RunState.SUCCEEDED, "worker:0 finished successfully")
TIMEOUT, PREEMPTED = AllocationOver("TIMEOUT", True), AllocationOver("PREEMPTED", True)
CANCELLED = AllocationOver("CANCELLED", False)


def unseen(why: str) -> Outcome:
    return Outcome(RunState.FAILED, f"{UNSEEN.reason}; {why}")


# An allocation tfctl was started inside (the user's own `salloc`): its time limit is its owner's.
NOT_OURS = AllocationOver("TIMEOUT", False)

# (outcome, active, allocations ended so far, resubmits, the backend's word) -> decision
DECISIONS = [
    (FAILED, True, 0, 2, TIMEOUT, Resubmit("TIMEOUT", 2)),
    (FAILED, True, 1, 2, PREEMPTED, Resubmit("PREEMPTED", 3)),
    (FAILED, True, 2, 2, TIMEOUT, Finish(FAILED)),  # every resubmission used
    (FAILED, True, 0, 0, TIMEOUT, Finish(FAILED)),  # a run without `resubmit`
    (FAILED, True, 0, 2, CANCELLED, Finish(FAILED)),  # a user's scancel is no reason to go on
    (FAILED, True, 0, 2, NOT_OURS, Finish(FAILED)),
    (FAILED, True, 0, 2, None, Finish(FAILED)),  # the allocation holds: the tasks failed by themselves
    (SUCCEEDED, True, 0, 2, TIMEOUT, Finish(SUCCEEDED)),  # done just before the limit: done
    (FAILED, False, 0, 2, TIMEOUT, Finish(FAILED, recorded=True)),  # a `down` came first: its words stand
    # The successor allocation's controller: nobody saw how the tasks ended.
    (None, True, 0, 2, TIMEOUT, Resubmit("TIMEOUT", 2)),
    (None, True, 0, 2, CANCELLED, Finish(unseen("its allocation ended: CANCELLED"))),
    (None, True, 2, 2, PREEMPTED, Finish(unseen("no resubmission left"))),
    (None, False, 1, 2, TIMEOUT, Finish(STOPPED_BY_DOWN, recorded=True)),
]


@pytest.mark.parametrize(("outcome", "active", "ended", "resubmits", "over", "decision"), DECISIONS)
def test_a_run_goes_on_only_after_a_time_limit_or_preemption_with_resubmissions_left(
    outcome: Outcome | None, active: bool, ended: int, resubmits: int, over: AllocationOver | None, decision: object
) -> None:
    assert decide(Seen(outcome, active, ended, resubmits, over)) == decision


@pytest.mark.parametrize(("outcome", "active", "ended", "resubmits", "over", "decision"), DECISIONS)
def test_the_backend_is_asked_only_when_its_word_can_change_the_decision(
    outcome: Outcome | None, active: bool, ended: int, resubmits: int, over: AllocationOver | None, decision: object
) -> None:
    """`worth_asking` decides without the backend exactly the rows whose decision is the same
    whatever the backend says."""
    seen = Seen(outcome, active, ended, resubmits)
    whatever = {decide(Seen(outcome, active, ended, resubmits, word)) for word in (TIMEOUT, CANCELLED, None)}
    early = worth_asking(seen)
    assert (early is not None) == (len(whatever) == 1)
    if early is not None:
        assert early == decision


def test_a_down_while_the_new_allocation_is_asked_for_ends_the_run_and_gives_it_back() -> None:
    """The interleaving, step by step: the allocation times out, the engine says resubmit, the
    driver asks the scheduler; a `down` ends the run before the new allocation is granted; once
    it is granted the run is not started there, and the new allocation goes back."""
    seen = Seen(FAILED, True, 0, 2)
    assert worth_asking(seen) is None  # step 1: the backend is asked why the allocation ended
    assert decide(Seen(FAILED, True, 0, 2, TIMEOUT)) == Resubmit("TIMEOUT", 2)  # step 2: resubmit
    # step 3: the `down` records the run's end; step 4: the allocation is granted, the run is over
    assert once_acquired(FAILED, still_active=False) == Finish(FAILED, recorded=True, release_new=True)
    assert once_acquired(None, still_active=False) == Finish(STOPPED_BY_DOWN, recorded=True, release_new=True)
    assert once_acquired(FAILED, still_active=True) is None  # no `down`: the run starts there


def test_a_down_before_the_allocation_ended_needs_no_word_from_the_backend() -> None:
    """The `down` came first: whatever the scheduler says next, the run is over as it recorded."""
    assert worth_asking(Seen(FAILED, False, 0, 3)) == Finish(FAILED, recorded=True)
