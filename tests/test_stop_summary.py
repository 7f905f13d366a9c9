"""What `down` says it proved: never more than it checked."""

from __future__ import annotations

import os
import subprocess

from tfctl.cli.render import stop_summary
from tfctl.cluster.answers import StopReport
from tfctl.supervisor import procfs, tasks
from tfctl.supervisor.files import task_dir, write_json
from tfctl.supervisor.protocol import StartRequest, StopAnswer, StopRequest, TaskLaunch


def test_a_clean_stop_says_so_for_every_host() -> None:
    report = StopReport(processes=5, hosts=3, ports=[2222, 2223])
    assert stop_summary(report) == "5 processes stopped on 3 hosts; 0 remain; ports 2222-2223 free"


def test_hosts_that_could_not_be_checked_are_named_and_the_proof_is_for_the_others_only() -> None:
    report = StopReport(processes=2, hosts=3, ports=[2222], unreachable={"h3": "h3: timed out", "h2": "refused"})
    summary = stop_summary(report)
    assert (
        summary
        == "2 processes stopped on 1 of 3 hosts (h2, h3 could not be checked); 0 remain there; port 2222 free there"
    )
    assert not report.clean


def test_tasks_that_had_ended_are_counted_so_fewer_processes_do_not_read_as_missed() -> None:
    report = StopReport(processes=1, hosts=1, ports=[2222], ended=2)
    assert stop_summary(report) == "2 tasks had ended; 1 process stopped on 1 host; 0 remain; port 2222 free"
    # An older supervisor's answer has no count: it reads as none ended, and the words are left out.
    older = StopAnswer(processes=1, killed=0, remaining=[]).to_wire()
    del older["ended"]
    assert StopAnswer.from_wire(older).ended == 0


def test_a_task_whose_process_is_gone_before_its_end_is_recorded_counts_as_ended(tmp_path) -> None:
    """A task that exits by itself as the stop begins (its monitor still writing exit.json) is
    neither stopped nor missed: it had ended, and the count says so."""
    root = str(tmp_path)
    tasks.start(root, StartRequest("r", [TaskLaunch("worker:0", "true")], spawn=False))
    gone = subprocess.Popen(["true"])
    gone.wait()
    stat = {"pid": gone.pid, "pgid": gone.pid, "starttime": 1, "boot_id": procfs.boot_id(), "started_at": 1.0}
    write_json(os.path.join(task_dir(root, "r", "worker:0"), "proc.json"), stat)
    answer = tasks.stop(root, StopRequest("r", 0))
    assert (answer.processes, answer.ended) == (0, 1)
