"""The run engine's decisions as tables on a fake clock: no thread, no sleep, no host.

Each scenario is a list of looks (when each began, how long it took, which hosts were silent,
which tasks had ended) replayed step by step through `Supervision`, and through the driver
(`control.supervise`) with a scripted cluster; the interleavings that were once races found by a
loaded CI machine are spelled out here, one row each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests.fakes import record_of
from tfctl.cluster import control
from tfctl.cluster.cluster import Cluster
from tfctl.engine.clock import Cancel, FakeClock
from tfctl.engine.live_run import End, Look, Move, Supervision
from tfctl.engine.observed import TaskStatus
from tfctl.engine.reconcile import Rules
from tfctl.engine.verdicts import STOPPED_BY_DOWN, Outcome
from tfctl.errors import StartupError
from tfctl.runs.record import RunRecord
from tfctl.supervisor.protocol import RunState, TaskState

HOSTS = {"ps:0": "h0", "worker:0": "h1", "worker:1": "h2"}
FAILED, STOPPED, SUCCEEDED = RunState.FAILED, RunState.STOPPED, RunState.SUCCEEDED


def statuses(silent: tuple[str, ...] = (), **ended: str) -> list[TaskStatus]:
    """Every task running but those `ended` (worker_1="failed") and those on `silent` hosts."""
    out = []
    for name, host in HOSTS.items():
        job, index = name.split(":")
        state = "unreachable" if host in silent else ended.get(name.replace(":", "_"), "running")
        exit_code = 1 if state == "failed" else 0 if state == "succeeded" else None
        out.append(TaskStatus(name, job, int(index), host, 2222, TaskState(state), exit_code=exit_code))
    return out


def look(began: float, silent: tuple[str, ...] = (), can_move: bool = False, **ended: str) -> Look:
    why = {h: f"{h}: no answer within 5s" for h in silent}
    return Look(began, statuses(silent, **ended), why, can_move)


def engine(patience: float = 25.0) -> Supervision:
    return Supervision(("worker:0",), ("ps:0",), patience)


# --------------------------------------------------------------------------- a host's silence

# (when each look began, when it was weighed, the silent hosts) -> the look that loses h2
SILENCE = [
    # A look that waits 5 s for a frozen host: its silence counts from when the look began (0),
    # so 25 s of patience run out at the look weighed at 25.5, not 5 s later.
    ([(0, 5, ("h2",)), (6, 11, ("h2",)), (12, 17, ("h2",)), (18, 23, ("h2",)), (24, 25.5, ("h2",))], 4),
    # Silent, back, silent again: the second silence counts afresh.
    ([(0, 5, ("h2",)), (20, 21, ()), (22, 27, ("h2",)), (40, 45, ("h2",)), (48, 53, ("h2",))], 4),
    # Back within patience: never lost.
    ([(0, 5, ("h2",)), (20, 25, ("h2",)), (24, 24.5, ())], None),
]


@pytest.mark.parametrize(("looks", "lost_at"), SILENCE)
def test_a_host_is_lost_once_silent_longer_than_its_patience_counted_from_the_look_it_missed(
    looks: list[tuple[float, float, tuple[str, ...]]], lost_at: int | None
) -> None:
    e, clock = engine(25), FakeClock(start=0)
    verdicts = []
    for began, weighed, silent in looks:
        clock.advance(weighed - clock.monotonic())
        verdicts.append(e.observe(look(began, silent), clock.monotonic(), clock.time()).verdict)
    lost = [i for i, v in enumerate(verdicts) if v is not None]
    assert lost == ([] if lost_at is None else [lost_at])
    if lost_at is not None:
        verdict = verdicts[lost_at]
        assert isinstance(verdict, End) and verdict.outcome.state is FAILED
        assert verdict.outcome.reason.startswith("lost contact with h2 since ")
        assert verdict.outcome.reason.endswith("(25s, host_timeout): h2: no answer within 5s")
        assert verdict.outcome.silent == ("h2",)  # the final stop does not wait for it


def test_the_silent_hosts_are_noted_when_they_change_and_only_then() -> None:
    e, clock = engine(), FakeClock(start=100, epoch=5000)
    noted = []
    for began, silent in [(100, ()), (101, ("h2",)), (102, ("h2",)), (103, ("h1", "h2")), (104, ())]:
        clock.advance(began + 0.5 - clock.monotonic())
        noted.append(e.observe(look(began, silent), clock.monotonic(), clock.time()).silence)
    assert noted == [None, {"h2": 5001.0}, None, {"h1": 5003.0, "h2": 5001.0}, {}]


# --------------------------------------------------------------------------- failures and spares

# 9c2b978: a frozen all-reduce peer fails worker 0 on UNAVAILABLE within seconds, long before its
# host's silence is judged. With a spare left, the silent host's verdict comes first.
# (steps: (look began, weighed, silent, ended tasks, spare left)) -> the verdict of each step
HELD = [
    pytest.param(
        [
            (0, 1, ("h2",), {}, True),
            (2, 3, ("h2",), {"worker_0": "failed"}, True),
            (30, 31, ("h2",), {"worker_0": "failed"}, True),
        ],
        [None, None, Move("h2", "lost", ("worker:0",))],
        id="failure while a peer is silent waits for the peer's verdict, then moves with it",
    ),
    pytest.param(
        [
            (0, 1, ("h2",), {}, True),
            (2, 3, ("h2",), {"worker_0": "failed"}, True),
            (4, 5, (), {"worker_0": "failed"}, True),
        ],
        [None, None, "worker:0 on h1 exited with code 1"],
        id="the peer answers again: the failure stands",
    ),
    pytest.param(
        [(0, 1, ("h2",), {}, False), (2, 3, ("h2",), {"worker_0": "failed"}, False)],
        [None, "worker:0 on h1 exited with code 1"],
        id="no spare left: the failure fails the run at once",
    ),
    pytest.param(
        [(0, 1, (), {"worker_0": "succeeded", "ps_0": "stopped"}, False)],
        ["worker:0 finished successfully"],
        id="a ps its host stopped once the job was over does not undo the success",
    ),
    pytest.param(
        [(0, 1, (), {"worker_1": "lost"}, True)],
        [Move("h2", "lost", ())],
        id="a task lost with its host (rebooted) moves with a spare",
    ),
]


@pytest.mark.parametrize(("steps", "expected"), HELD)
def test_failures_while_a_host_is_silent(steps: list, expected: list) -> None:
    e, clock = engine(25), FakeClock(start=0)
    got: list[object] = []
    for began, weighed, silent, ended, spare in steps:
        clock.advance(weighed - clock.monotonic())
        step = e.observe(look(began, silent, spare, **ended), clock.monotonic(), clock.time())
        verdict = step.verdict
        if isinstance(verdict, Move):
            got.append(Move(verdict.host, "lost", verdict.ended))
        else:
            got.append(None if verdict is None else verdict.outcome.reason)
    assert got == expected


def test_a_move_that_fails_fails_the_run_with_the_lost_host_not_waited_for() -> None:
    e, clock = engine(5), FakeClock(start=0)
    clock.advance(6)
    move = e.observe(look(0, ("h2",), can_move=True), clock.monotonic(), clock.time()).verdict
    assert isinstance(move, Move)
    ended = e.move_failed(move)
    assert ended.outcome.state is FAILED and ended.outcome.reason == move.why and ended.outcome.silent == ("h2",)


def test_a_host_moved_away_takes_its_silence_with_it() -> None:
    e, clock = engine(5), FakeClock(start=0)
    clock.advance(6)
    move = e.observe(look(0, ("h2",), can_move=True), clock.monotonic(), clock.time()).verdict
    assert isinstance(move, Move)
    clock.advance(1)  # the next look asks the hosts of the record as the move left it: h2 is not among them
    assert e.observe(look(7), clock.monotonic(), clock.time()).silence == {}


def test_judges_are_asked_only_when_the_states_decide_nothing() -> None:
    e = engine()
    assert e.observe(look(0), 1, 1).ask_judges
    assert not e.observe(look(1, worker_0="succeeded"), 2, 2).ask_judges


# --------------------------------------------------------------------------- the driver


@dataclass
class ScriptedCluster:
    """A cluster whose looks are scripted: each status() answers the next row, taking `takes`
    seconds of the fake clock (a frozen host holds a look for `Deadlines.status`), and may set the
    cancel token meanwhile (a `down` arriving during the look)."""

    record: RunRecord
    clock: FakeClock
    rows: list[tuple[float, tuple[str, ...], dict[str, str]]]
    cancel_at: int | None = None
    cancel: Cancel = field(default_factory=Cancel)
    looks: list[float] = field(default_factory=list)

    def status(self) -> tuple[list[TaskStatus], dict[str, Exception]]:
        row = min(len(self.looks), len(self.rows) - 1)
        takes, silent, ended = self.rows[row]
        self.looks.append(self.clock.monotonic())
        self.clock.advance(takes)
        if self.cancel_at == row:
            self.cancel.set(STOPPED_BY_DOWN.reason)
        return statuses(silent, **ended), {h: RuntimeError(f"{h}: no answer") for h in silent}


def drive(cluster: ScriptedCluster, host_patience: float = 25.0, **options: Any) -> Outcome:
    """The real driver over the scripted cluster, on its fake clock and cancel token, a look a second."""
    rules: Rules[object] = Rules(cluster.record.decisive, cluster.record.essential, host_patience)
    return control.supervise(cast(Cluster, cluster), rules, cancel=cluster.cancel, clock=cluster.clock, **options)


def scripted(rows: list, record: RunRecord | None = None, cancel_at: int | None = None) -> ScriptedCluster:
    return ScriptedCluster(record or record_of(HOSTS), FakeClock(start=0), rows, cancel_at)


def test_driver_a_frozen_host_is_lost_within_one_look_of_its_patience() -> None:
    cluster = scripted([(0.1, (), {})] + [(5.0, ("h2",), {})] * 20)
    outcome = drive(cluster, host_patience=25)
    froze = cluster.looks[1]  # the first look h2 missed began here
    assert outcome.state is FAILED and outcome.silent == ("h2",)
    # Lost at the first look weighed past 25 s: at most one look (5 s) and one pause (1 s) late.
    assert 25 < cluster.clock.monotonic() - froze <= 25 + 6, cluster.looks


def test_driver_a_down_during_a_look_that_sees_a_stopped_task_ends_as_tfctl_down() -> None:
    """34d9bdc: a `down` arrives while a look is under way and its answer already shows a task
    stopped; the run ends as the `down` asked, with one reason, whichever came first."""
    cluster = scripted([(0.5, (), {}), (0.5, (), {"worker_1": "stopped"})], cancel_at=1)
    outcome = drive(cluster)
    assert outcome == STOPPED_BY_DOWN


def test_driver_a_held_failure_moves_with_the_silent_host_on_its_verdict() -> None:
    """9c2b978 through the driver: worker 0 fails two looks after h2 froze; with a spare left the
    run is neither failed nor decided until h2 is lost, and the move restarts worker 0 too."""
    record = record_of(HOSTS)
    record = record.replace(spares=("h9",))
    moves: list[tuple[str, tuple[str, ...]]] = []

    def on_lost(host: str, _why: str, ended: tuple[str, ...]) -> bool:
        moves.append((host, ended))
        cluster.rows = [(0.1, (), {"worker_0": "succeeded"})]  # on the spare, it trains to the end
        cluster.looks.clear()
        return True

    rows = [(0.1, (), {}), (5, ("h2",), {}), (5, ("h2",), {"worker_0": "failed"})] + [
        (5, ("h2",), {"worker_0": "failed"})
    ] * 10
    cluster = scripted(rows, record)
    outcome = drive(cluster, host_patience=20, on_lost=on_lost)
    assert moves == [("h2", ("worker:0",))]
    assert outcome == Outcome(SUCCEEDED, "worker:0 finished successfully")


def test_driver_cancel_before_any_look_ends_at_once_with_its_reason() -> None:
    cluster = scripted([(0.1, (), {})])
    cluster.cancel.set("SIGTERM")
    outcome = drive(cluster)
    assert outcome == Outcome(STOPPED, "SIGTERM") and cluster.looks == []


# --------------------------------------------------------------------------- a refused probe

# e4aae48: a resumed run's quick ps listened, was seen listening, and exited as the other hosts
# probed it; its monitor recorded the end a moment after the refusal. (the ps's state at each
# look after the refusal, seconds between looks) -> what the start makes of it
REFUSALS = [
    pytest.param(["running", "running", "succeeded"], 0.2, "finished", id="ended after two looks: probed no more"),
    pytest.param(["running", "failed"], 0.2, "failed", id="failed meanwhile: the start fails as itself"),
    pytest.param(["running"] * 40, 0.2, "network", id="still running after the settle time: the network"),
    pytest.param(["succeeded"], 0.2, "finished", id="ended at the first look"),
]


@dataclass
class ProbedCluster:
    """The ps refused by every probe; each look after that answers the next scripted state."""

    record: RunRecord
    clock: FakeClock
    states: list[str]
    looks: int = 0

    def check_reachable(self, _sources: object, addresses: list[str], _progress: object) -> None:
        if addresses:  # (once it ended, the ps is probed no more)
            raise StartupError("1 of 2 connections failed: h1 -> h0:2222: refused")

    def status(self, _tasks: object) -> tuple[list[TaskStatus], dict[str, Exception]]:
        state = self.states[min(self.looks, len(self.states) - 1)]
        self.looks += 1
        code = 1 if state == "failed" else 0
        return [TaskStatus("ps:0", "ps", 0, "h0", 2222, TaskState(state), exit_code=code)], {}

    def last_lines_text(self, _task: str) -> str:
        return ""


@pytest.mark.parametrize(("states", "pause", "meaning"), REFUSALS)
def test_a_refused_probe_is_judged_by_the_targets_ends_first(states: list[str], pause: float, meaning: str) -> None:
    cluster = ProbedCluster(record_of(HOSTS), FakeClock(start=0), states)
    said: list[tuple[str, str]] = []
    try:
        control.probe_listening(cast(Cluster, cluster), ["h1"], ["ps:0"], lambda *m: said.append(m), cluster.clock)
        got = "finished" if said == [("ps:0", "finished already (exit code 0)")] else "?"
    except StartupError as e:
        got = (
            "network"
            if "refused" in e.message
            else "failed"
            if e.message.startswith("ps:0 exited with code 1")
            else "?"
        )
    assert got == meaning
    if meaning == "network":  # looked at for PROBE_SETTLE seconds, not a look longer
        assert control.PROBE_SETTLE < cluster.clock.monotonic() <= control.PROBE_SETTLE + pause
