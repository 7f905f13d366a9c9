"""Live notes (`up`, `logs -f`): a known TF pattern becomes a warning only if it lasts.

Fed with the lines of real TF runs (tests/data/tf_logs) on a clock the test moves: healthy runs
give no note at all, a wait that later lines end gives none, a wait or a failure that lasts does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl.engine.observed import TaskStatus
from tfctl.runs.record import ProgressSpec
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.diagnose import Kind
from tfctl.tf.doctor import FAILURE_HOLD, HOLD, REPEATED_HOLD, TAIL_LINES, LiveNotes, diagnose_run

DATA = Path(__file__).resolve().parent / "data" / "tf_logs"
HEALTHY = ("healthy_chief_worker0.log", "healthy_worker1.log", "keras_fit_progress_bar.log")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class QuietCluster:
    """Just enough of a Cluster for explanations: no statuses, reachability unknown."""

    class record:
        progress = ProgressSpec()

    def status(self, progress=None, tail=0) -> tuple[list, dict]:
        return [], {}

    def reachable(self, source: str, address: str) -> None:
        return None


def lines(name: str) -> list[str]:
    return [line for line in (DATA / name).read_text().splitlines() if not line.startswith("# ")]


def feed(notes: LiveNotes, clock: Clock, task: str, name: str, every: float = 0.05) -> list:
    """Each line of a capture `every` seconds apart, asking for due notes after each, as `up` does."""
    due = []
    for line in lines(name):
        notes.feed(task, line)
        clock.now += every
        due += notes.due()
    return due


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_runs_give_no_note(name: str) -> None:
    clock = Clock()
    notes = LiveNotes(QuietCluster(), clock)  # type: ignore[arg-type]
    due = feed(notes, clock, "worker:0", name)
    clock.now += 600
    assert due + notes.due() == []


def test_a_wait_that_lasts_becomes_a_note_after_its_hold_and_not_before() -> None:
    clock = Clock()
    notes = LiveNotes(QuietCluster(), clock)  # type: ignore[arg-type]
    assert feed(notes, clock, "worker:0", "createsession_waiting_for_ps.log") == []
    clock.now += HOLD[Kind.WAITING_FOR_PEER] - 5
    assert notes.due() == []
    clock.now += 10
    ((task, finding),) = notes.due()
    assert (task, finding.kind, finding.peer) == ("worker:0", Kind.WAITING_FOR_PEER, "ps:0")
    assert finding.kind is Kind.WAITING_FOR_PEER
    assert notes.due() == []  # said once


def test_a_wait_that_later_lines_end_is_no_note() -> None:
    clock = Clock()
    notes = LiveNotes(QuietCluster(), clock)  # type: ignore[arg-type]
    feed(notes, clock, "worker:0", "mwms_waiting_for_worker1.log")
    clock.now += 1  # the peer connected a second later; the program prints its first step
    notes.feed("worker:0", "step 0 loss 2.3")
    clock.now += 600
    assert notes.due() == []


def test_waiting_for_model_is_held_past_tfs_own_30_second_retry() -> None:
    clock = Clock()
    notes = LiveNotes(QuietCluster(), clock)  # type: ignore[arg-type]
    feed(notes, clock, "worker:1", "nonchief_waiting_for_model.log")
    clock.now += 35
    assert notes.due() == []
    clock.now += HOLD[Kind.WAITING_FOR_MODEL]
    assert [f.kind for _, f in notes.due()] == [Kind.WAITING_FOR_MODEL]


def test_a_failure_is_noted_within_seconds() -> None:
    clock = Clock()
    notes = LiveNotes(QuietCluster(), clock)  # type: ignore[arg-type]
    feed(notes, clock, "worker:0", "oom_eager_huge_tensor.log", every=0)
    clock.now += FAILURE_HOLD + 0.1
    assert [f.kind for _, f in notes.due()] == [Kind.OOM]


def test_a_cancelled_step_while_the_run_ends_normally_is_no_note() -> None:
    # Workers finish and tfctl stops the ps: a worker still in a step logs the cancellation. The
    # run ends within the hold, so the caller never asks again.
    clock = Clock()
    notes = LiveNotes(QuietCluster(), clock)  # type: ignore[arg-type]
    assert feed(notes, clock, "worker:0", "ps_killed_worker0_default.log", every=0) == []
    clock.now += HOLD[Kind.STEP_CANCELLED] - 1
    assert notes.due() == []


class TwoWorkers(QuietCluster):
    """Both workers run; their statuses say nothing of progress (bare arrays, no tail)."""

    def status(self, progress=None, tail=0) -> tuple[list, dict]:
        return [
            TaskStatus(f"worker:{i}", "worker", i, "localhost", 2222 + i, TaskState.RUNNING, listening=True)
            for i in (0, 1)
        ], {}


def test_a_model_wait_repeated_while_another_task_moved_on_is_noted_within_seconds() -> None:
    """The Hogwild hang: worker 1's variables are never initialised while the chief trains."""
    for chief_up in (True, False):
        clock = Clock()
        notes = LiveNotes(TwoWorkers(), clock)  # type: ignore[arg-type]
        chief = lines("supervisor_hogwild_chief_bare_arrays.log")
        for line in chief if chief_up else chief[:12]:  # trains (bare arrays), or still starting
            notes.feed("worker:0", line)
        due = feed(notes, clock, "worker:1", "supervisor_hogwild_worker1_never_initialised.log", every=0.2)
        clock.now += REPEATED_HOLD
        due += notes.due()
        if chief_up:
            ((task, finding),) = due
            assert (task, finding.kind, finding.peer) == ("worker:1", Kind.WAITING_FOR_MODEL, "worker:0")
            assert "the chief worker:0 trains" in finding.cause  # known from its lines, not its steps
        else:
            assert due == []  # a start-up race, held past TF's own 30 s retry


def worker1_noted_waiting() -> tuple[LiveNotes, list[str]]:
    """The Hogwild hang, noted: the chief trains (its lines, returned too), worker 1 repeats its
    wait past REPEATED_HOLD."""
    clock = Clock()
    notes = LiveNotes(TwoWorkers(), clock)  # type: ignore[arg-type]
    chief = lines("supervisor_hogwild_chief_bare_arrays.log")
    for line in chief:
        notes.feed("worker:0", line)
    feed(notes, clock, "worker:1", "supervisor_hogwild_worker1_never_initialised.log", every=0.2)
    clock.now += REPEATED_HOLD
    notes.due()
    return notes, chief


def test_a_noted_wait_outlives_the_traceback_that_ends_the_task_and_names_it_at_the_end() -> None:
    """Once the chief has finished, the waiting worker's next try fails with UnavailableError:
    its tail is then all traceback, and only the wait seen live says it never got past waiting."""
    notes, chief = worker1_noted_waiting()
    assert "worker:1" in notes.waited
    last = lines("hogwild_worker1_unavailable_after_the_chief_left.log")
    for line in last:
        notes.feed("worker:1", line)
    assert notes.waited["worker:1"].kind is Kind.WAITING_FOR_MODEL  # a traceback is no progress
    ended = [
        TaskStatus("worker:0", "worker", 0, "localhost", 2222, TaskState.SUCCEEDED, exit_code=0, tail=tuple(chief)),
        TaskStatus(
            "worker:1", "worker", 1, "localhost", 2223, TaskState.STOPPED, signal=15, tail=tuple(last[-TAIL_LINES:])
        ),
    ]
    assert diagnose_run(TwoWorkers(), ended).never_ready == {}  # type: ignore[arg-type]
    found = diagnose_run(TwoWorkers(), ended, notes.waited).never_ready  # type: ignore[arg-type]
    assert list(found) == ["worker:1"] and "the chief worker:0 trained, then" in found["worker:1"].cause


def test_a_noted_wait_that_the_task_gets_past_is_forgotten() -> None:
    notes, _ = worker1_noted_waiting()
    assert "worker:1" in notes.waited
    notes.feed("worker:1", "[0.51 0.49]")  # it trains after all
    assert "worker:1" not in notes.waited


def test_a_task_started_anew_is_judged_by_its_new_lines_only() -> None:
    """Noted waiting, then a traceback as it was stopped for a move; started anew, it trains: it
    did get past waiting, and ended as it should."""
    notes, chief = worker1_noted_waiting()
    for line in lines("hogwild_worker1_unavailable_after_the_chief_left.log"):
        notes.feed("worker:1", line)
    notes.feed("worker:1", "[0.51 0.49]")
    assert "worker:1" in notes.waited  # progress after its own failure proves nothing of its session
    notes.forget({"worker:1"})
    assert "worker:1" not in notes.waited
    for line in chief:  # its new life trains
        notes.feed("worker:1", line)
    assert "worker:1" not in notes.waited


def test_a_task_that_succeeded_never_counts_as_having_waited_throughout() -> None:
    notes, chief = worker1_noted_waiting()
    last = tuple(lines("hogwild_worker1_unavailable_after_the_chief_left.log"))
    ended = [
        TaskStatus("worker:0", "worker", 0, "localhost", 2222, TaskState.SUCCEEDED, exit_code=0, tail=tuple(chief)),
        TaskStatus("worker:1", "worker", 1, "localhost", 2223, TaskState.SUCCEEDED, exit_code=0, tail=last),
    ]
    assert diagnose_run(TwoWorkers(), ended, notes.waited).never_ready == {}  # type: ignore[arg-type]


def test_a_wait_of_a_task_that_was_silent_while_its_peer_printed_is_told_as_its_silence() -> None:
    """Issue 33's all_workers run: worker 1 says nothing after its session came up while worker 0
    prints for 20 s and leaves; worker 1's retry then waits for worker 0 at CreateSession. That
    wait is noted as the silence it follows, not as missing device filters."""
    clock = Clock()
    notes = LiveNotes(QuietCluster(), clock)  # type: ignore[arg-type]
    scanning = "I0000 00:00:1795824706.042538   23212 coordination_service.cc:221] Initializing CoordinationService"
    notes.feed("worker:1", scanning)
    for i in range(400):
        notes.feed("worker:0", f"[0.9{i % 10} 1.43]")
        clock.now += 0.05
        assert notes.due() == []
    retry = (
        "I0000 00:00:1795824736.259590    5045 master.cc:278] CreateSession still waiting for response from "
        "worker: /job:worker/replica:0/task:0"
    )
    notes.feed("worker:1", retry)
    clock.now += HOLD[Kind.WAITING_FOR_PEER] + 1
    ((task, finding),) = notes.due()
    assert task == "worker:1" and finding.cause.startswith(f"printed nothing for 20 s after `{scanning}`")
    assert "while worker:0 printed 400 lines" in finding.cause and "device filters" not in finding.cause
    assert "set_verbosity" in finding.fix


def test_notes_asked_between_a_tasks_restart_and_its_first_new_line_do_not_fail() -> None:
    """A move restarts worker:1; the attached `up` asks for due notes before the new worker:1
    prints (CI: `IndexError` on its emptied recent lines killed the `up` of a spare move)."""
    notes, _chief = worker1_noted_waiting()
    notes.forget({"worker:1"})
    assert notes.due() == [] and "worker:1" not in notes.silent
