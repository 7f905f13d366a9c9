"""Waiting for a phase's tasks to listen (`engine/starting.py`) as tables on the time passed in:
each row is one answer of the hosts, when it was asked and read, and what the wait makes of it."""

from __future__ import annotations

import dataclasses

import pytest

from tfctl.engine.observed import TaskStatus
from tfctl.engine.starting import LISTEN_POLL, LISTEN_POLL_MAX, LISTEN_WAIT, Heard, ListenWait, began
from tfctl.runs.record import TaskSpec
from tfctl.supervisor.protocol import TaskInfo, TaskState

HOSTS = {"ps:0": "h0", "ps:1": "h1"}


def seen(name: str, state: str = "running", listening: bool = False, code: int | None = None) -> TaskStatus:
    job, index = name.split(":")
    return TaskStatus(name, job, int(index), HOSTS[name], 2222, TaskState(state), exit_code=code, listening=listening)


RUNNING, LISTENS = seen("ps:0"), seen("ps:0", listening=True)

# (required, answers as (asked, read, statuses)) -> the last answer's meaning. The wait began at 0,
# for ps:0 (and ps:1 where named), with a timeout of 10 s.
ROWS = [
    ("listens at the first answer", True, [(0, 0.2, [LISTENS])], Heard((("ps:0", 0.2),), done=True)),
    (
        "a host that answered early without listening is asked again after a short pause",
        True,
        [(0, 0.0, [RUNNING])],
        Heard(pause=LISTEN_POLL),
    ),
    (
        "the pause grows with the time waited, to a tenth of it",
        True,
        [(3.0, 3.1, [RUNNING])],
        Heard(pause=0.31),
    ),
    ("and no further than its limit", True, [(8.0, 8.0, [RUNNING])], Heard(pause=LISTEN_POLL_MAX)),
    (
        "a host that waited its full patience is asked again at once",
        True,
        [(2.0, 2.0 + LISTEN_WAIT, [RUNNING])],
        Heard(),
    ),
    (
        "a task done with exit 0 needs no waiting for",
        True,
        [(0, 0.1, [seen("ps:0", "succeeded", code=0)])],
        Heard(done=True),
    ),
    (
        "a task that failed before it listened fails the start",
        True,
        [(0, 0.1, [seen("ps:0", "failed", code=1)])],
        Heard(failed=seen("ps:0", "failed", code=1)),
    ),
    ("the deadline passed: the start fails", True, [(9.5, 10.5, [RUNNING])], Heard(late=("ps:0",))),
    (
        "the deadline passed where the wait is a hint: go on",
        False,
        [(9.5, 10.5, [RUNNING])],
        Heard(late=("ps:0",), go_on=True),
    ),
    (
        "one of two listens, the other later",
        True,
        [(0, 0.5, [LISTENS, seen("ps:1")]), (0.6, 1.6, [seen("ps:1", listening=True)])],
        Heard((("ps:1", 1.6),), done=True),
    ),
    (
        "one listens as the other fails: the failure decides",
        True,
        [(0, 0.5, [LISTENS, seen("ps:1", "failed", code=2)])],
        Heard((("ps:0", 0.5),), failed=seen("ps:1", "failed", code=2)),
    ),
    (
        "a task heard of after it listened is not counted twice",
        True,
        [(0, 0.5, [LISTENS, seen("ps:1")]), (0.6, 0.7, [LISTENS, seen("ps:1")])],
        Heard(pause=0.07),
    ),
]


@pytest.mark.parametrize("required, answers, last", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_answer_means_what_the_table_says(
    required: bool, answers: list[tuple[float, float, list[TaskStatus]]], last: Heard
) -> None:
    names = sorted({s.task for _a, _r, statuses in answers for s in statuses})
    wait = ListenWait(names, 10.0, required, began=0.0)
    heard = [wait.heard(statuses, asked, read) for asked, read, statuses in answers]
    assert dataclasses.replace(heard[-1], pause=0.0) == dataclasses.replace(last, pause=0.0)
    assert heard[-1].pause == pytest.approx(last.pause)
    assert len(wait.listening) == len(set(wait.listening))


def test_the_hosts_wait_for_the_ports_themselves_no_longer_than_the_deadline_leaves() -> None:
    wait = ListenWait(["ps:0"], 10.0, True, began=100.0)
    assert [wait.patience(t) for t in (100.0, 109.5, 111.0)] == [LISTEN_WAIT, 0.5, 0.0]


# --------------------------------------------------------------------------- the start's answer


def answer(name: str, state: str, code: int | None = None, error: str | None = None) -> tuple[TaskSpec, TaskInfo]:
    job, index = name.split(":")
    spec = TaskSpec(job, int(index), HOSTS[name], 2222, "python train.py", {}, None)
    return spec, TaskInfo(name, TaskState(state), pid=41 if state == "running" else None, exit_code=code, error=error)


RUN_0, RUN_1 = answer("ps:0", "running"), answer("ps:1", "running")
NO_FILE = "could not start: No such file or directory"
# (what each host said of its task) -> the lines said, and the failure
BEGAN = [
    pytest.param([RUN_1, RUN_0], [("ps:0", "running (pid 41)"), ("ps:1", "running (pid 41)")], None, id="in order"),
    pytest.param([answer("ps:0", "succeeded", 0)], [("ps:0", "finished already (exit code 0)")], None, id="done"),
    pytest.param(
        [answer("ps:0", "failed", 2), RUN_1],
        [],
        ("ps:0", "ps:0 exited with code 2, right after it started"),
        id="ended at once: the start fails",
    ),
    pytest.param(
        [answer("ps:0", "failed", None, NO_FILE)], [], ("ps:0", f"ps:0 {NO_FILE}"), id="an error says when itself"
    ),
]


@pytest.mark.parametrize(("answers", "said", "failed"), BEGAN)
def test_the_start_answer_says_each_task_and_fails_on_one_that_ended(
    answers: list[tuple[TaskSpec, TaskInfo]], said: list[tuple[str, str]], failed: tuple[str, str] | None
) -> None:
    heard = began(answers)
    assert (list(heard.said), heard.failed) == (said, failed)
