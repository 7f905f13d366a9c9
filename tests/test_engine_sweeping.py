"""A sweep's decisions as tables: each trial's state from its runs, which start next, when over."""

from __future__ import annotations

import pytest

from tfctl.engine.sweeping import Attempt, Start, TrialSeen, TrialState, changes, step, trial_state
from tfctl.supervisor.states import RunState

OK, BAD, STOP, LIVE, STARTING = (
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.STOPPED,
    RunState.RUNNING,
    RunState.STARTING,
)


def runs(*states: RunState, cut: int | None = None, ended_at: float = 10.0) -> tuple[Attempt, ...]:
    return tuple(Attempt(f"r{i}", s, i == cut, ended_at if s.is_final else None) for i, s in enumerate(states))


@pytest.mark.parametrize(
    "attempts, refused, retries, resumed_at, expected",
    [
        ((), 0, 0, None, TrialState.PENDING),  # never started
        (runs(STARTING), 0, 0, None, TrialState.RUNNING),
        (runs(LIVE), 0, 0, None, TrialState.RUNNING),
        (runs(OK), 0, 0, None, TrialState.SUCCEEDED),
        (runs(BAD), 0, 0, None, TrialState.FAILED),  # no retries
        (runs(BAD), 0, 1, None, TrialState.PENDING),  # its one retry
        (runs(BAD, BAD), 0, 1, None, TrialState.FAILED),  # the retry spent
        (runs(BAD, OK), 0, 1, None, TrialState.SUCCEEDED),
        (runs(BAD, cut=0), 0, 0, None, TrialState.PENDING),  # cut off by tfctl's death: costs no retry
        (runs(BAD, BAD, cut=0), 0, 0, None, TrialState.FAILED),
        ((), 1, 0, None, TrialState.FAILED),  # a start refused before any run
        ((), 1, 1, None, TrialState.PENDING),
        (runs(BAD), 1, 1, None, TrialState.FAILED),  # refused once and failed once: two failures
        (runs(STOP), 0, 3, None, TrialState.STOPPED),  # a `down` is no failure, and is not retried
        (runs(STOP, ended_at=5.0), 0, 0, 7.0, TrialState.PENDING),  # stopped, then the sweep resumed
        (runs(STOP, ended_at=9.0), 0, 0, 7.0, TrialState.STOPPED),  # stopped after the resume
        (runs(OK, ended_at=5.0), 0, 0, 7.0, TrialState.SUCCEEDED),  # a resume re-runs nothing that ended well
    ],
)
def test_trial_state(
    attempts: tuple[Attempt, ...], refused: int, retries: int, resumed_at: float | None, expected: TrialState
) -> None:
    assert trial_state(TrialSeen(0, attempts, refused), retries, resumed_at) is expected


def seen(*trials: tuple[Attempt, ...]) -> tuple[TrialSeen, ...]:
    return tuple(TrialSeen(i, attempts) for i, attempts in enumerate(trials))


@pytest.mark.parametrize(
    "trials, max_parallel, retries, stopping, starts, over",
    [
        (seen((), (), (), ()), 2, 0, False, [Start(0), Start(1)], False),  # in trial order, up to the limit
        (seen(runs(LIVE), (), (), ()), 2, 0, False, [Start(1)], False),  # one runs: room for one
        (seen(runs(LIVE), runs(LIVE), (), ()), 2, 0, False, [], False),  # full
        (seen(runs(OK), runs(BAD), (), ()), 2, 0, False, [Start(2), Start(3)], False),  # a failure frees room too
        (seen(runs(BAD), runs(OK)), 2, 1, False, [Start(0, "r0")], False),  # a retry continues its run's files
        (seen(runs(BAD, cut=0)), 1, 0, False, [Start(0, "r0")], False),  # so does a start cut off
        (seen(runs(OK), runs(BAD)), 2, 0, False, [], True),  # all ended: over, failures and all
        (seen(runs(LIVE), ()), 2, 0, True, [], False),  # stopping: nothing starts, over once none runs
        (seen(runs(STOP), ()), 2, 0, True, [], True),
        ((), 1, 0, False, [], True),  # no trials (cannot be made, but is over)
    ],
)
def test_step(
    trials: tuple[TrialSeen, ...], max_parallel: int, retries: int, stopping: bool, starts: list[Start], over: bool
) -> None:
    decided = step(trials, max_parallel, retries, stopping)
    assert list(decided.start) == starts
    assert decided.over is over


def test_never_more_running_than_max_parallel_however_the_trials_stand() -> None:
    """Every mix of 6 trials' states: what runs plus what starts stays within the limit."""
    import itertools

    shapes = [(), runs(LIVE), runs(OK), runs(BAD), runs(STARTING)]
    for combo in itertools.product(shapes, repeat=6):
        for limit in (1, 2, 3):
            decided = step(seen(*combo), limit, 0, False)
            running = decided.states.count(TrialState.RUNNING)
            assert running + len(decided.start) <= max(limit, running)
            assert {s.index for s in decided.start} <= {i for i, a in enumerate(combo) if a == ()}


def test_changes_tell_each_trial_whose_state_moved_once() -> None:
    first = (TrialState.RUNNING, TrialState.PENDING, TrialState.SUCCEEDED)
    assert changes((), first) == [(0, TrialState.RUNNING), (2, TrialState.SUCCEEDED)]
    later = (TrialState.SUCCEEDED, TrialState.PENDING, TrialState.SUCCEEDED)
    assert changes(first, later) == [(0, TrialState.SUCCEEDED)]
    assert changes(later, later) == []
