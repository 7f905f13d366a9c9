"""The reconcile step (`engine.reconcile`) as tables on the time passed in: what each look saw,
and the plan it gets back (its actions in order, when and how to look next). No host, no
thread, no clock but the numbers in the rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import pytest

from tfctl.engine.events import EventKind
from tfctl.engine.live_run import End, Look, Move
from tfctl.engine.observed import TaskStatus
from tfctl.engine.reconcile import NoteSilence, Notify, Plan, Reconciler, Rules, Ruling, Say, Seen
from tfctl.engine.retiring import LeftBehind
from tfctl.engine.verdicts import Outcome
from tfctl.supervisor.protocol import RunState, TaskState

HOSTS = {"ps:0": "h0", "worker:0": "h1", "worker:1": "h2"}
FAILED, STOPPED, SUCCEEDED = RunState.FAILED, RunState.STOPPED, RunState.SUCCEEDED


def statuses(**states: str) -> list[TaskStatus]:
    """Every task running but those named (worker_1="failed"; "unreachable" for a silent host)."""
    out = []
    for name, host in HOSTS.items():
        job, index = name.split(":")
        state = TaskState(states.get(name.replace(":", "_"), "running"))
        code = 1 if state is TaskState.FAILED else 0 if state is TaskState.SUCCEEDED else None
        out.append(TaskStatus(name, job, int(index), host, 2222, state, exit_code=code))
    return out


def seen(at: float, sight: Any = None, asked: bool = False, end: str | None = None, **states: str) -> Seen[Any]:
    silent = {HOSTS[n.replace("_", ":")]: "no answer" for n, s in states.items() if s == "unreachable"}
    return Seen(Look(at, statuses(**states), silent), sight, asked, end)


def reconciler(judges: Sequence[Any] = (), patience: float = 25.0, **limits: int) -> Reconciler[Any]:
    restarts = {name.replace("_", ":"): n for name, n in limits.items()}
    return Reconciler(Rules(("worker:0",), ("ps:0",), patience, restarts, judges))


def kinds(plan: Plan) -> list[str]:
    return [type(a).__name__ for a in plan.actions]


# --------------------------------------------------------------------------- when to look, and how


def test_the_first_look_is_at_once_with_everything_asked() -> None:
    assert reconciler([lambda s, now: Ruling()]).first() == Plan(sight=True, allocation=True)
    assert reconciler().first() == Plan(sight=False, allocation=True)  # no judge: no closer look


# A look a second: the judges' closer look and the allocation's are due every 5 s (JUDGE_EVERY,
# ALLOCATION_EVERY), each counted from when it was last taken. (the looks' times, which of them
# bring the closer look and the allocation's word) -> which of the plans ask for them next
SCHEDULE = [
    pytest.param([0, 1, 2, 3, 4, 5, 6], {0, 5}, [False, False, False, False, True, False, False], id="every 5 s"),
    pytest.param([0, 1, 2, 3, 4, 5, 6], {0}, [False, False, False, False, True, True, True], id="asked until taken"),
    pytest.param([0, 7, 8], {0, 8}, [False, True, False], id="a look that took 7 s: due at once"),
]


@pytest.mark.parametrize(("times", "taken", "asked"), SCHEDULE)
def test_the_closer_look_and_the_allocation_are_asked_every_five_seconds(
    times: list[float], taken: set[float], asked: list[bool]
) -> None:
    engine = reconciler([lambda s, now: Ruling()])
    plans = [engine.step(seen(t, "sight" if t in taken else None, t in taken), t, 1e9 + t) for t in times]
    assert [p.sight for p in plans] == asked
    assert [p.allocation for p in plans] == asked
    assert {p.look_again_in for p in plans} == {1.0}


def test_no_task_running_is_judged_by_no_judge_and_the_closer_look_is_asked_again() -> None:
    asked: list[float] = []

    def judge(_sight: object, now: float) -> Ruling:
        asked.append(now)
        return Ruling()

    engine = reconciler([judge])
    plan = engine.step(seen(0, "sight", ps_0="pending", worker_0="pending", worker_1="pending"), 0, 1e9)
    assert asked == [] and plan.sight  # (pending: not yet running)
    engine.step(seen(1, "sight"), 1, 1e9 + 1)
    assert asked == [1]


# (what each judge wants of the look at 0 s) -> the next plan: a closer look at once with all of it
WANTS = [
    pytest.param([{"lines"}, set()], {"lines"}, id="one judge wants"),
    pytest.param([{"lines"}, {"probe"}], {"lines", "probe"}, id="two judges: both fetched in one look"),
    pytest.param([set(), set()], set(), id="none: the next look as scheduled"),
]


@pytest.mark.parametrize(("wanted", "plan_wants"), WANTS)
def test_what_the_judges_want_is_fetched_in_a_closer_look_at_once(wanted: list[set[str]], plan_wants: set[str]) -> None:
    engine = reconciler([lambda s, now, w=frozenset(w): Ruling(wants=w) for w in wanted])
    engine.step(seen(0, "sight"), 0, 1e9)
    plan = engine.step(seen(1, "sight"), 1, 1e9 + 1)  # (the closer look is not due again until 5 s)
    assert plan.wants == plan_wants
    assert (plan.sight, plan.look_again_in) == ((True, 0.0) if plan_wants else (False, 1.0))


def test_a_verdict_drops_what_the_judges_wanted() -> None:
    judges = [lambda s, now: Ruling(wants=frozenset({"lines"})), lambda s, now: Ruling(Outcome(FAILED, "hung"))]
    plan = reconciler(judges).step(seen(0, "sight"), 0, 1e9)
    assert kinds(plan) == ["End"] and plan.wants == frozenset()


# --------------------------------------------------------------------------- what ends the run, in order

END_ORDER = [
    # (the look, the judges' verdict) -> the run's end, or None while it goes on
    pytest.param({}, None, None, id="nothing to say"),
    pytest.param({"worker_0": "succeeded"}, "hung", SUCCEEDED, id="states decide before the judges"),
    pytest.param({"end": "Slurm ended job 7: TIMEOUT"}, "hung", FAILED, id="the allocation's end before the judges"),
    pytest.param({"worker_0": "succeeded", "end": "ended"}, None, SUCCEEDED, id="states before the allocation"),
    pytest.param({}, "hung", FAILED, id="a judge's verdict"),
    pytest.param({"ps_0": "stopped"}, None, STOPPED, id="a task stopped by its host"),
]


@pytest.mark.parametrize(("looked", "verdict", "ends"), END_ORDER)
def test_what_ends_the_run_is_weighed_in_order(looked: dict[str, str], verdict: str | None, ends: Any) -> None:
    states = {k: v for k, v in looked.items() if k != "end"}
    end = looked.get("end")
    judged = Outcome(FAILED, verdict, "worker:1") if verdict else None
    plan = reconciler([lambda s, now: Ruling(judged)]).step(seen(0, "sight", True, end, **states), 0, 1e9)
    got = plan.end
    assert (got.outcome.state if got else None) == ends
    if end is not None and ends is FAILED:
        assert got is not None and got.outcome.reason == end
    assert (got is None) == (plan.look_again_in == 1.0)


def test_a_cancel_during_the_look_ends_the_run_with_its_reason_whatever_the_look_saw() -> None:
    judged = Outcome(FAILED, "hung")
    cancelled = replace(seen(0, "sight", True, "ended", ps_0="stopped"), cancelled="tfctl down")
    plan = reconciler([lambda s, now: Ruling(judged)]).step(cancelled, 0, 1e9)
    assert plan == Plan((End(Outcome(STOPPED, "tfctl down")),))


def test_the_judges_actions_are_kept_in_order_and_the_first_verdict_wins() -> None:
    ended = Outcome(FAILED, "worker:1 hung", "worker:1")
    judges = [
        lambda s, now: Ruling(actions=(Say("one"), Say("two"))),
        lambda s, now: Ruling(ended, (Say("three"),)),
        lambda s, now: Ruling(actions=(Say("never"),)),  # after the verdict: not asked
    ]
    plan = reconciler(judges).step(seen(0, "sight"), 0, 1e9)
    assert plan.actions == (Say("one"), Say("two"), Say("three"), End(ended))


# --------------------------------------------------------------------------- a silent host, a lost one


def test_a_silent_host_is_noted_when_it_goes_silent_and_when_it_is_back() -> None:
    engine = reconciler()
    plans = [engine.step(seen(t, worker_1="unreachable" if 1 <= t <= 2 else "running"), t, 1e9 + t) for t in range(4)]
    notes = [[dict(a.since) for a in p.actions if isinstance(a, NoteSilence)] for p in plans]
    assert notes == [[], [{"h2": 1e9 + 1}], [], [{}]]


def test_a_lost_host_with_a_spare_is_a_move_looked_after_at_once_and_without_one_the_end() -> None:
    engine = reconciler(patience=2)
    silent = [
        replace(seen(t, worker_1="unreachable"), look=replace(seen(t, worker_1="unreachable").look, can_move=True))
        for t in (0, 1, 3)
    ]
    plans = [engine.step(s, s.look.began, 1e9) for s in silent]
    assert kinds(plans[-1]) == ["Move"] and plans[-1].look_again_in == 0.0
    move = plans[-1].move
    assert isinstance(move, Move) and move.host == "h2"
    assert engine.move_failed(move).outcome.state is FAILED
    alone = reconciler(patience=2)
    ends = [alone.step(seen(t, worker_1="unreachable"), t, 1e9) for t in (0, 1, 3)]
    assert ends[-1].end is not None and ends[-1].end.outcome.reason.startswith("lost contact with h2 since ")


# --------------------------------------------------------------------------- events


def restarted(task: str, restarts: int, state: str = "running") -> TaskStatus:
    job, index = task.split(":")
    ends = tuple(f"exited with code {n}" for n in range(1, restarts + 1))
    return TaskStatus(task, job, int(index), HOSTS[task], 2222, TaskState(state), restarts=restarts, earlier_ends=ends)


# (worker:1's restarts at each look, and its state) -> the `restarted` events told
RESTARTS = [
    pytest.param([(0, "running"), (1, "running"), (1, "running")], ["restart 1 of 3"], id="told once"),
    pytest.param([(2, "running"), (2, "running")], [], id="a new controller: none before its first look"),
    pytest.param([(0, "running"), (2, "running")], ["restart 2 of 3"], id="two between looks: the count"),
    pytest.param([(0, "running"), (0, "unreachable"), (1, "running")], ["restart 1 of 3"], id="silent between"),
]


@pytest.mark.parametrize(("looks", "told"), RESTARTS)
def test_a_restart_by_a_tasks_monitor_is_told_once(looks: list[tuple[int, str]], told: list[str]) -> None:
    engine = reconciler(worker_1=3)
    events = []
    for t, (count, state) in enumerate(looks):
        row = [s for s in statuses() if s.task != "worker:1"] + [restarted("worker:1", count, state)]
        plan = engine.step(Seen(Look(t, row)), t, 1e9 + t)
        events += [a for a in plan.actions if isinstance(a, Notify)]
    assert [e.kind for e in events] == [EventKind.RESTARTED] * len(told)
    assert [e.reason.rsplit("; ", 1)[1] for e in events] == told
    assert all(e.reason.startswith("worker:1 on h2 exited with code") and e.task == "worker:1" for e in events)


# --------------------------------------------------------------------------- a host the run left

# Looks a second; h9 is on the record's lost hosts from the first. (at each look, what h9
# answered since the last one: "-" nothing yet, "silent", "survivors", "clean") -> the actions
LEFT = [
    pytest.param(
        ["-"] * 7,
        {5: ["AskToStop"]},
        id="asked after RETIRE_POLL, not again while the ask is under way",
    ),
    pytest.param(
        ["-"] * 5 + ["-", "silent", "-", "-", "-", "-", "-"],
        {5: ["AskToStop"], 11: ["AskToStop"]},
        id="silent: asked again RETIRE_POLL after its answer",
    ),
    pytest.param(
        ["-"] * 6 + ["survivors"] + ["-"] * 5 + ["survivors", "-"],
        {5: ["AskToStop"], 6: ["Say"], 11: ["AskToStop"]},
        id="survivors of SIGKILL said once",
    ),
    pytest.param(
        ["-"] * 6 + ["clean"] + ["-"] * 8,
        {5: ["AskToStop"], 6: ["Say", "StrikeOff"]},
        id="clean: said, struck off, asked no more",
    ),
]
ANSWERS = {"silent": None, "survivors": LeftBehind(0, (4242,)), "clean": LeftBehind(2)}


@pytest.mark.parametrize(("answers", "acted"), LEFT)
def test_a_host_the_run_left_is_asked_to_stop_until_it_has(answers: list[str], acted: dict[int, list[str]]) -> None:
    engine = reconciler()
    got = {}
    for t, said in enumerate(answers):
        left_behind = {} if said == "-" else {"h9": ANSWERS[said]}
        plan = engine.step(replace(seen(t), left=("h9",), left_behind=left_behind), t, 1e9 + t)
        if plan.actions:
            got[t] = kinds(plan)
    assert got == acted


def test_a_host_struck_off_the_record_is_asked_no_more() -> None:
    engine = reconciler()
    engine.step(replace(seen(0), left=("h9",)), 0, 1e9)
    assert kinds(engine.step(seen(6), 6, 1e9 + 6)) == []  # (no longer on the record's lost hosts)
