"""Moving a lost host's tasks to a spare (`engine/moving.py`) as tables: which spare, which tasks
move and which start again with the new address, and whether the next spare takes them after a
failed move. TensorFlow's rules (`tf/moves.py`) are the ones passed in."""

from __future__ import annotations

import pytest

from tests.fakes import record_of
from tfctl.engine.events import EventKind
from tfctl.engine.moving import NextMove, after_failed_move, plan_move
from tfctl.runs.record import RunRecord
from tfctl.tf import moves as tf_moves

PS_RUN = {"ps:0": "h1", "worker:0": "h2", "worker:1": "h3"}
ALLREDUCE = {"worker:0": "h1", "worker:1": "h2", "worker:2": "h3"}


def run(tasks: dict[str, str], spares: tuple[str, ...] = ("s1", "s2")) -> RunRecord:
    return record_of(tasks).replace(spares=spares)


# (tasks, lost host, restart_all, ended) -> (spare, moved, restarted)
PLANS = [
    ("a ps moved restarts its clients", PS_RUN, "h1", False, (), ("s1", ["ps:0"], ["worker:0", "worker:1"])),
    (
        "a worker moved restarts the ps and the workers",
        PS_RUN,
        "h3",
        False,
        (),
        ("s1", ["worker:1"], ["ps:0", "worker:0"]),
    ),
    (
        "an all-reduce peer restarts its group",
        ALLREDUCE,
        "h2",
        False,
        (),
        ("s1", ["worker:1"], ["worker:0", "worker:2"]),
    ),
    ("after a failed move every task starts again", PS_RUN, "h1", True, (), ("s1", ["ps:0"], ["worker:0", "worker:1"])),
    (
        "a task that ended badly meanwhile starts again",
        ALLREDUCE,
        "h1",
        False,
        ("worker:2",),
        ("s1", ["worker:0"], ["worker:1", "worker:2"]),
    ),
]


@pytest.mark.parametrize("tasks, lost, restart_all, ended, want", [p[1:] for p in PLANS], ids=[p[0] for p in PLANS])
def test_a_move_takes_the_first_spare_and_restarts_who_must(
    tasks: dict[str, str], lost: str, restart_all: bool, ended: tuple[str, ...], want: tuple[str, list[str], list[str]]
) -> None:
    record = run(tasks)
    plan = plan_move(record, lost, "silent", tf_moves, restart_all, ended)
    assert plan is not None
    spare, moved, restarted = want
    assert (plan.spare, [t.name for t in plan.moved], [t.name for t in plan.restarted]) == (spare, moved, restarted)
    assert all(t.host == spare for t in plan.moved) and len(plan.tasks) == len(record.tasks)
    moved_address = f"{spare}:{plan.moved[0].port}"
    assert all(moved_address in t.env.get("TF_CONFIG", moved_address) for t in plan.restarted)
    assert plan.ended == tuple(n for n in ended if n in restarted)


def test_no_spare_left_or_no_task_there_is_no_move() -> None:
    assert plan_move(run(PS_RUN, spares=()), "h1", "silent", tf_moves) is None
    assert plan_move(run(PS_RUN), "h9", "silent", tf_moves) is None


def test_the_move_is_recorded_for_each_moved_task() -> None:
    plan = plan_move(run(PS_RUN), "h1", "silent for 25s", tf_moves)
    assert plan is not None
    (move,) = plan.record_moves(7.0)
    assert (move.at, move.task, move.from_host, move.to_host, move.why) == (7.0, "ps:0", "h1", "s1", "silent for 25s")
    assert move.restarted == ("worker:0", "worker:1")


# (the spare had been given the tasks, it answers) -> the next move
AFTER = [
    (
        "the spare took them and is silent: the next spare takes them",
        True,
        False,
        NextMove("s1", "spare s1 failed: ps:0 did not listen"),
    ),
    ("the spare answers: the failure is the tasks', not the host's", True, True, None),
    ("the move failed before the spare had them", False, False, None),
]


@pytest.mark.parametrize("took, answers, want", [a[1:] for a in AFTER], ids=[a[0] for a in AFTER])
def test_after_a_failed_move(took: bool, answers: bool, want: NextMove | None) -> None:
    plan = plan_move(run(PS_RUN), "h1", "silent", tf_moves)
    assert plan is not None
    assert after_failed_move(plan, took, answers, "ps:0 did not listen\n  last lines: ...") == want


def test_a_move_says_why_and_who_restarts_then_tells_one_moved_event_a_task() -> None:
    plan = plan_move(run(ALLREDUCE), "h1", "lost contact with h1", tf_moves, ended=("worker:2",))
    assert plan is not None
    assert [line.text for line in plan.announced()] == [
        "lost contact with h1: moving worker:0 to spare s1",
        "worker:2 ended while h1 was silent: starting again with the move",
        "restarting worker:1: their cluster names the new address",
    ]
    told = plan.told()
    assert [(e.kind, e.task, e.reason) for e in told] == [
        (EventKind.MOVED, "worker:0", "worker:0 moved from h1 to s1: lost contact with h1")
    ]
