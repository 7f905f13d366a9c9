"""What `down` says it proved: never more than it checked."""

from __future__ import annotations

from tfctl.cli.render import stop_summary
from tfctl.cluster.answers import StopReport
from tfctl.supervisor.protocol import StopAnswer


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
