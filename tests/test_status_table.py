"""What `status` shows of training progress: steps, epochs, and a word when nothing is readable."""

from __future__ import annotations

import io

from rich.console import Console

from tests.fakes import record_of
from tfctl.controller.views.status_table import status_table
from tfctl.controller.views.status_view import Snapshot
from tfctl.engine.observed import TaskStatus
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.diagnose import Finding, Kind
from tfctl.tf.doctor import RunDiagnosis
from tfctl.tf.progress import TaskProgress, unread_progress


def status(task: str, last_line: str = "", uptime: float = 300.0) -> TaskStatus:
    job, index = task.split(":")
    return TaskStatus(task, job, int(index), "h", 2222, TaskState.RUNNING, pid=1, uptime=uptime, last_line=last_line)


def shown(statuses: list[TaskStatus], progress: dict[str, TaskProgress]) -> str:
    record = record_of({s.task: "h" for s in statuses})
    shot = Snapshot(statuses, {}, RunDiagnosis({}, {}), progress)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(status_table(shot, record, 200))
    return out.getvalue()


def test_epochs_get_a_column_of_their_own_and_go_to_json() -> None:
    statuses = [status("ps:0"), status("worker:0", "Finished epoch 3")]
    progress = {"ps:0": TaskProgress(None, None, ()), "worker:0": TaskProgress(None, None, (), epoch=3)}
    table = shown(statuses, progress)
    header = next(line for line in table.splitlines() if "TASK" in line)
    assert header.split()[7:10] == ["EPOCH", "STEP", "STEPS/S"]
    row = next(line for line in table.splitlines() if line.startswith("worker:0"))
    assert row.split()[7] == "3"
    shot = Snapshot(statuses, {}, RunDiagnosis({}, {}), progress)
    assert shot.to_json(record_of({"ps:0": "h", "worker:0": "h"}))["tasks"][1]["epoch"] == 3


def test_without_epochs_there_is_no_epoch_column() -> None:
    table = shown([status("worker:0", "step 5")], {"worker:0": TaskProgress(5, 1.0, ())})
    assert "EPOCH" not in table


def test_a_trainer_printing_nothing_readable_is_told_once_how_to_set_progress_regex() -> None:
    statuses = [
        status("ps:0", "serving"),  # a ps never trains: no word about it
        status("worker:0", "[0.51 0.49]"),
        status("worker:1", "[0.50 0.50]"),
        status("worker:2", "step 7"),
        status("worker:3", "[0.1 0.9]", uptime=5),  # too early to say
    ]
    progress = {s.task: TaskProgress(None, None, ()) for s in statuses}
    progress["worker:2"] = TaskProgress(7, 1.0, ())
    assert unread_progress(statuses, progress) == ["worker:0", "worker:1"]
    table = shown(statuses, progress)
    assert table.count("progress: {regex:") == 1 and "worker:0, worker:1: print, but no line reads" in table


def test_an_ended_task_that_never_got_past_waiting_is_named_in_the_table_and_the_json() -> None:
    statuses = [
        TaskStatus("worker:0", "worker", 0, "h", 2222, TaskState.SUCCEEDED, exit_code=0, last_line="[0.51 0.49]"),
        TaskStatus("worker:1", "worker", 1, "h", 2223, TaskState.STOPPED, last_line="INFO:tensorflow:Waiting for"),
    ]
    progress = {s.task: TaskProgress(None, None, ()) for s in statuses}
    wait = Finding(Kind.WAITING_FOR_MODEL, "worker:1", "its variables live on its own task", "place them on a ps", "")
    shot = Snapshot(statuses, {}, RunDiagnosis({}, {}, {"worker:1": wait}), progress)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(status_table(shot, record_of({"worker:0": "h"}), 200))
    assert "worker:1: never got past waiting: its variables live on its own task" in out.getvalue()
    assert "worker:0: never" not in out.getvalue()
    tasks = shot.to_json(record_of({"worker:0": "h", "worker:1": "h"}))["tasks"]
    assert [t["diagnosis"] and t["diagnosis"]["kind"] for t in tasks] == [None, "waiting_for_model"]
