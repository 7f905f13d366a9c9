"""control.decide: a run's outcome from its tasks' states; and status_table.number_ranges."""

from __future__ import annotations

import pytest

from tfctl.controller.views.status_table import number_ranges
from tfctl.engine.observed import TaskStatus
from tfctl.engine.verdicts import Outcome, decide
from tfctl.supervisor.protocol import RunState, TaskState

CHIEF = ["chief:0"]
ALL_WORKERS = ["chief:0", "worker:0", "worker:1"]
PS = ["ps:0", "ps:1"]
STATES = [state.value for state in TaskState]
FAILED, STOPPED, SUCCEEDED = RunState.FAILED, RunState.STOPPED, RunState.SUCCEEDED


def st(name: str, state: str = "running", host: str = "h1", **kw) -> TaskStatus:
    job, index = name.split(":")
    return TaskStatus(
        task=name, job=job, index=int(index), host=host, port=2222 + int(index), state=TaskState(state), **kw
    )


def cluster(**states: str) -> list[TaskStatus]:
    """All tasks of a chief + 2 ps + 2 workers + evaluator cluster, running unless named."""
    names = ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "evaluator:0"]
    return [st(n, states.get(n.replace(":", "_"), "running")) for n in names]


# --- success -------------------------------------------------------------------------------------


def test_chief_succeeded_is_success_while_ps_still_run() -> None:
    out = decide(cluster(chief_0="succeeded"), CHIEF, PS)
    assert out == Outcome(SUCCEEDED, "chief:0 finished successfully", None)


def test_worker0_is_decisive_without_chief() -> None:
    statuses = [st("ps:0"), st("worker:0", "succeeded", exit_code=0), st("worker:1")]
    assert decide(statuses, ["worker:0"], ["ps:0"]) == Outcome(SUCCEEDED, "worker:0 finished successfully")


def test_all_workers_needs_every_decisive_task() -> None:
    assert decide(cluster(chief_0="succeeded", worker_0="succeeded"), ALL_WORKERS, PS) is None
    assert decide(cluster(worker_0="succeeded", worker_1="succeeded"), ALL_WORKERS, PS) is None
    out = decide(cluster(chief_0="succeeded", worker_0="succeeded", worker_1="succeeded"), ALL_WORKERS, PS)
    assert out is not None and out.succeeded
    assert out.reason == "chief:0, worker:0, worker:1 finished successfully"
    assert out.culprit is None


def test_non_decisive_worker_succeeding_decides_nothing() -> None:
    assert decide(cluster(worker_1="succeeded", evaluator_0="succeeded"), CHIEF, PS) is None


def test_decisive_success_wins_over_ps_ending_in_the_same_poll() -> None:
    # The job completed; a ps that ended by then did not end "before completion".
    out = decide(cluster(chief_0="succeeded", ps_0="succeeded"), CHIEF, PS)
    assert out is not None and out.succeeded


# --- failure -------------------------------------------------------------------------------------


def test_failed_task_names_itself_and_its_exit_code() -> None:
    statuses = [st("ps:0"), st("worker:0"), st("worker:1", "failed", host="gpu1", exit_code=3)]
    out = decide(statuses, ["worker:0"], ["ps:0"])
    assert out == Outcome(FAILED, "worker:1 on gpu1 exited with code 3", "worker:1")


def test_failed_by_signal_names_the_signal() -> None:
    statuses = [st("ps:0"), st("worker:0", "failed", signal=9)]
    out = decide(statuses, ["worker:0"], ["ps:0"])
    assert out == Outcome(
        FAILED,
        "worker:0 on h1 was killed by signal 9 (SIGKILL, maybe by the kernel's out-of-memory killer)",
        "worker:0",
    )


def test_failed_to_start_names_the_error() -> None:
    statuses = [st("worker:0", "failed", exit_code=127, error="could not start: [Errno 2] No such file")]
    out = decide(statuses, ["worker:0"], [])
    assert out == Outcome(FAILED, "worker:0 on h1 could not start: [Errno 2] No such file", "worker:0")


def test_lost_task_is_a_failure() -> None:
    out = decide(cluster(worker_1="lost"), CHIEF, PS)
    assert out is not None and not out.succeeded
    assert out.culprit == "worker:1"
    assert out.reason.startswith("worker:1 on h1 was lost")


@pytest.mark.parametrize("task", ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "evaluator:0"])
@pytest.mark.parametrize("state", ["failed", "lost"])
def test_any_failed_or_lost_task_fails_the_job(task: str, state: str) -> None:
    out = decide(cluster(**{task.replace(":", "_"): state}), CHIEF, PS)
    assert out is not None and not out.succeeded
    assert out.culprit == task
    assert out.reason.startswith(f"{task} on h1 ")


def test_failure_wins_over_decisive_success_in_the_same_poll() -> None:
    statuses = cluster(chief_0="succeeded")
    statuses[4] = st("worker:1", "failed", exit_code=1)
    out = decide(statuses, CHIEF, PS)
    assert out == Outcome(FAILED, "worker:1 on h1 exited with code 1", "worker:1")


def test_stopped_task_fails_the_job_as_stopped() -> None:
    out = decide(cluster(worker_1="stopped"), CHIEF, PS)
    assert out == Outcome(STOPPED, "worker:1 on h1 was stopped (tfctl down)", "worker:1")
    assert "stopped" in out.reason


def test_failed_is_reported_before_stopped() -> None:
    statuses = [st("worker:0", "stopped"), st("worker:1", "failed", exit_code=2)]
    out = decide(statuses, ["worker:0"], [])
    assert out is not None and out.culprit == "worker:1"


def test_stopped_decisive_task_is_not_success() -> None:
    out = decide([st("ps:0"), st("worker:0", "stopped")], ["worker:0"], ["ps:0"])
    assert out is not None and not out.succeeded and out.culprit == "worker:0"


def test_essential_ps_ending_before_completion_fails_the_job() -> None:
    statuses = cluster(ps_1="succeeded")
    statuses[2] = st("ps:1", "succeeded", host="ps-host", exit_code=0)
    out = decide(statuses, CHIEF, PS)
    assert out == Outcome(FAILED, "ps:1 on ps-host ended while the job was running (exited with code 0)", "ps:1")


def test_non_essential_task_ending_with_0_is_not_a_failure() -> None:
    # A ps is only essential when decide is told so.
    assert decide(cluster(ps_0="succeeded"), CHIEF, []) is None


# --- undecided -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "starting", "running", "unreachable"])
def test_undecided_while_tasks_are_not_final(state: str) -> None:
    statuses = [st(n, state) for n in ("chief:0", "ps:0", "ps:1", "worker:0", "worker:1")]
    assert decide(statuses, CHIEF, PS) is None


def test_undecided_for_a_fresh_cluster() -> None:
    assert decide(cluster(), CHIEF, PS) is None
    assert decide(cluster(), ALL_WORKERS, PS) is None


@pytest.mark.parametrize(
    "statuses",
    [
        [],
        [st("ps:0"), st("worker:1", "succeeded")],
        [st("worker:1", "succeeded")],
    ],
)
def test_decisive_missing_from_statuses_is_undecided_not_success(statuses: list) -> None:
    assert decide(statuses, ["worker:0"], ["ps:0"]) is None


def test_one_decisive_task_missing_under_all_workers_is_undecided() -> None:
    statuses = [st("chief:0", "succeeded"), st("worker:0", "succeeded")]  # worker:1 not reported (host down)
    assert decide(statuses, ALL_WORKERS, []) is None


def test_essential_missing_from_statuses_is_undecided() -> None:
    assert decide([st("chief:0")], CHIEF, PS) is None


def test_no_decisive_tasks_never_succeeds() -> None:
    assert decide([st("worker:0", "succeeded")], [], []) is None


def test_only_final_states_end_the_job() -> None:
    assert {s.value for s in TaskState if s.is_final} == {"succeeded", "failed", "stopped", "lost"}
    for state in STATES:
        out = decide([st("ps:0", state), st("worker:0")], ["worker:0"], ["ps:0"])
        assert (out is not None) == TaskState(state).is_final, state


# --- status_table.number_ranges --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ports,expected",
    [
        ([], ""),
        ([2222], "2222"),
        ([2222, 2223], "2222-2223"),
        ([2222, 2223, 2224], "2222-2224"),
        ([2222, 2223, 2224, 2230], "2222-2224, 2230"),
        ([2230, 2224, 2222, 2223], "2222-2224, 2230"),
        ([2222, 2222, 2223, 2223], "2222-2223"),
        ([1, 3, 5], "1, 3, 5"),
        ([10, 11, 13, 14, 20], "10-11, 13-14, 20"),
        ([65535, 65534, 1], "1, 65534-65535"),
    ],
)
def test_number_ranges(ports: list[int], expected: str) -> None:
    assert number_ranges(ports) == expected


def test_cores_are_written_as_taskset_writes_them() -> None:
    assert number_ranges([6, 0, 1, 2, 3], ",") == "0-3,6"


def test_number_ranges_does_not_modify_its_argument() -> None:
    ports = [2224, 2222, 2223]
    number_ranges(ports)
    assert ports == [2224, 2222, 2223]
