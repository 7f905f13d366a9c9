"""The judges (`tf.judges`) as tables on the time passed in: what a look saw, when, and what each
judge says of it. No host, no thread, no sleep: each row is one look."""

from __future__ import annotations

from typing import Mapping, Sequence

import pytest

from tests.fakes import record_of
from tfctl.engine.events import EventKind
from tfctl.engine.observed import TaskStatus
from tfctl.engine.reconcile import Notify, RestartTasks, Ruling, Say
from tfctl.runs.record import ProgressSpec
from tfctl.supervisor.protocol import RunState, TaskState
from tfctl.tf.explain import PeerInfo
from tfctl.tf.judges import COUNTED, HangJudge, Probe, Sight, SilenceJudge, StallJudge
from tfctl.tf.progress import RunProgress, TaskProgress
from tfctl.tf.silence import Silence

WAITING = "CreateSession still waiting for response from worker: /job:ps/replica:0/task:0"
TASKS = {"ps:0": "h0", "worker:0": "h1", "worker:1": "h2"}
RECORD = record_of(TASKS)


def status(name: str, state: str = "running", tail: Sequence[str] = (), listening: bool = False) -> TaskStatus:
    job, index = name.split(":")
    return TaskStatus(name, job, int(index), TASKS[name], 2222, TaskState(state), tail=tuple(tail), listening=listening)


def sight(
    tails: dict[str, list[str]] | None = None,
    flags: dict[str, tuple[str, ...]] | None = None,
    ended: tuple[str, ...] = (),
    probes: Mapping[Probe, bool | None] | None = None,
    listening: tuple[str, ...] = (),
) -> Sight:
    tails, flags = tails or {}, flags or {}
    statuses = [status(n, "succeeded" if n in ended else "running", tails.get(n, ()), n in listening) for n in TASKS]
    progress = {n: TaskProgress(None, None, flags.get(n, ()), quiet_for=100.0) for n in TASKS}
    peers = {s.task: PeerInfo.from_status(s) for s in statuses}
    return Sight(statuses, progress, peers, statuses, probes or {})


# --------------------------------------------------------------------------- hang_timeout

# (when each look is weighed, whether worker:1's tail shows TF's wait then) -> the look that fails
HANG = [
    # Waiting at 0, 5, 10: 10 s of patience run out at the look weighed at 10, not earlier.
    ([(0, True), (5, True), (10, True)], 2),
    # The wait ends (a peer came) and starts again: counted afresh from when it was seen again.
    ([(0, True), (5, False), (6, True), (12, True), (16, True)], 4),
    # Never waits long enough.
    ([(0, True), (9, False), (10, True), (19, True)], None),
]


@pytest.mark.parametrize("looks, fails_at", HANG)
def test_a_wait_fails_the_run_once_it_lasted_hang_timeout(
    looks: list[tuple[float, bool]], fails_at: int | None
) -> None:
    judge = HangJudge(10.0)
    rulings = [judge(sight({"worker:1": ["starting", WAITING] if waits else ["step 1"]}), now) for now, waits in looks]
    assert all(r.actions == () for r in rulings)  # a hang is an end, never an errand
    verdicts = [r.outcome for r in rulings]
    failed = [i for i, v in enumerate(verdicts) if v is not None]
    assert failed[:1] == ([] if fails_at is None else [fails_at])
    if fails_at is not None:
        verdict = verdicts[fails_at]
        assert verdict is not None and verdict.state is RunState.FAILED and verdict.culprit == "worker:1"
        assert verdict.reason.startswith("worker:1 has been stuck for over 10s: ")


# (what the probe of ps:0's address from worker:1's host found) -> the words of the hang
PROBED = [
    (True, "ps:0 is running and reachable at h0:2222 from h2"),
    (False, "but h0:2222 is NOT reachable from h2"),
    (None, "whether h2 can reach it is unknown"),
]


@pytest.mark.parametrize("reached, words", PROBED)
def test_a_hang_on_a_listening_peer_wants_the_connection_tried_before_it_says_why(
    reached: bool | None, words: str
) -> None:
    judge = HangJudge(10.0)
    tails = {"worker:1": [WAITING]}
    assert judge(sight(tails, listening=("ps:0",)), 0.0) == Ruling()
    wants = judge(sight(tails, listening=("ps:0",)), 10.0)
    assert wants == Ruling(wants=frozenset({Probe("h2", "h0:2222")}))  # asked of no host yet: wanted
    tried = {Probe("h2", "h0:2222"): reached}
    verdict = judge(sight(tails, probes=tried, listening=("ps:0",)), 10.0).outcome
    assert verdict is not None and words in verdict.reason


def test_a_hang_after_a_silence_is_blamed_on_the_silence() -> None:
    silence = Silence("worker:1", 40.0, "starting", "worker:0", "reached step 900", "it never joined", "check it")
    judge = HangJudge(10.0, silent={"worker:1": silence})
    waiting = sight({"worker:1": [WAITING]})
    assert judge(waiting, 100.0) == Ruling()
    verdict = judge(waiting, 110.0).outcome
    assert verdict is not None and "printed nothing for 40 s" in verdict.reason and "(fix: check it)" in verdict.reason


# --------------------------------------------------------------------------- progress.on_stall


def stall_judge(action: str) -> StallJudge:
    return StallJudge(RECORD.tasks, RunProgress(ProgressSpec(stall_timeout=60.0, on_stall=action)), action)


def test_a_stall_is_told_once_while_it_lasts_and_again_when_it_comes_back() -> None:
    judge = stall_judge("warn")
    stalled, stepping = sight(flags={"worker:1": ("stalled",)}), sight()
    rulings = [judge(seen, now) for now, seen in [(0, stalled), (5, stalled), (10, stepping), (15, stalled)]]
    assert [r.outcome for r in rulings] == [None] * 4
    told = [(a.kind, a.task) for r in rulings for a in r.actions if isinstance(a, Notify)]
    assert told == [(EventKind.STALLED, "worker:1")] * 2
    said = [a.text for r in rulings for a in r.actions if isinstance(a, Say)]
    assert (
        said
        == [
            "warning: worker:1 on h2 stalled: no step for 100s (progress.stall_timeout 60s); "
            "the run goes on (progress.on_stall: warn)"
        ]
        * 2
    )
    assert [len(r.actions) for r in rulings] == [2, 0, 0, 2]  # and nothing else is asked for


def test_on_stall_fail_ends_the_run_naming_the_task() -> None:
    verdict = stall_judge("fail")(sight(flags={"worker:1": ("stalled",)}), 0.0)
    assert verdict.outcome is not None and verdict.outcome.culprit == "worker:1"
    assert verdict.outcome.reason.endswith("; on_stall: fail") and verdict.actions == ()


def test_on_stall_restart_asks_to_restart_the_jobs_running_tasks_once_for_all_of_them() -> None:
    judge = stall_judge("restart")
    both = sight(flags={"worker:0": ("stalled",), "worker:1": ("stalled",)})
    first, second = judge(both, 0.0), judge(both, 5.0)
    assert first.outcome is None and second == Ruling()
    restart, said, told = first.actions  # the restart first, then the words that say it is under way
    assert isinstance(restart, RestartTasks) and [t.name for t in restart.tasks] == ["worker:0", "worker:1"]
    assert restart.why.startswith("stalled: no step for 100s")  # the ps is in another job; worker:1 not told apart
    assert isinstance(told, Notify) and (told.kind, told.task) == (EventKind.STALLED, "worker:0")
    assert isinstance(said, Say) and said.text.endswith("; restarting worker:0, worker:1 (progress.on_stall: restart)")


# --------------------------------------------------------------------------- silence


def test_a_silent_task_is_noted_once_and_its_lines_counted_only_when_it_is_news() -> None:
    """Each look: the judge says, or wants the lines counted first (and is then asked again at
    once, with them)."""
    said: list[str] = []
    wanted: list[float] = []
    observed = 1000.0

    def statuses() -> list[TaskStatus]:
        out = []
        for name, last_at, lines in [("ps:0", None, 3), ("worker:0", observed, 900), ("worker:1", observed - 50, 4)]:
            job, index = name.split(":")
            out.append(
                TaskStatus(
                    name, job, int(index), TASKS[name], 2222, TaskState.RUNNING, last_line="connecting",
                    observed_at=observed, output_at=last_at, output_lines=lines,
                )
            )  # fmt: skip
        return out

    progress = RunProgress(ProgressSpec())
    judge = SilenceJudge(progress, 30.0)
    for now in (0.0, 5.0, 10.0):
        looked = statuses()
        ruling = judge(Sight(looked, progress.assess(looked), {}), now)
        if ruling.wants:
            assert ruling == Ruling(wants=frozenset({COUNTED}))
            wanted.append(now)
            ruling = judge(Sight(looked, progress.assess(looked), {}, counted=looked), now)
        assert ruling.outcome is None and not ruling.wants
        said += [a.text for a in ruling.actions if isinstance(a, Say)]
    assert len(said) == 1 and said[0].startswith("note: worker:1 printed nothing for 50 s")
    assert wanted == [0.0] and set(judge.seen) == {"worker:1"}
