"""What people read (tfctl/controller/views/status_table.py, tfctl/cli/render.py), rendered from real
snapshots of runs on the fake backend: the status table with its device columns, restarts, steps
and rates, unreachable hosts and notes; stop summaries; log lines with the notes that last."""

from __future__ import annotations

import json
import time

import pytest

from tests.fake_runs import FAKE_FILE, amend, started, write
from tests.fakes import TaskScript
from tfctl import console
from tfctl.cli import render
from tfctl.cluster.answers import StopReport
from tfctl.cluster.output import Prefixer
from tfctl.controller.views import status_table, status_view
from tfctl.runs.record import RunRecord
from tfctl.tf.doctor import FAILURE_HOLD, LiveNotes

PLAIN = {"tty": False, "color": False, "width": 200}
DEVICES = FAKE_FILE.replace("  worker: [h1:2223, h2:2222]\n", "  worker:\n    hosts: [h1:2223, h2:2222]\n")
DEVICES += "    gpus: 1\n    cpus: 2\n    restart: {policy: on-failure, max_restarts: 1, backoff: 0}\n"
OOM = "ResourceExhaustedError: OOM when allocating tensor with shape[4096,4096] and type float on /device:GPU:0"


def table(shot: status_view.Snapshot, record: RunRecord) -> list[str]:
    return console.rendered(status_table.status_table(shot, record, 200), PLAIN).splitlines()


def cells(lines: list[str], task: str) -> list[str]:
    return next(line.split() for line in lines if line.startswith(task + " "))


def test_the_status_table_shows_devices_restarts_steps_rates_and_a_worker_that_never_trained(tmp_path, fake_backend):
    fake_backend.agent("h1").gpus = [0, 1]
    fake_backend.agent("h2").gpus = [0]
    fake_backend.scripts.update(
        {
            "worker:0": TaskScript(
                end_after=1, exit_code=1, after_restart=TaskScript(lines=["step 100", "step 200", "step 300"])
            ),
            "worker:1": TaskScript(end_after=1, exit_code=1, lines=["loading data", OOM]),
        }
    )
    store, cluster = started(write(tmp_path, DEVICES))
    with cluster:
        restarting = table(status_view.snapshot(cluster), store.load(cluster.record.run_id))  # both failed once
        assert cells(restarting, "worker:0")[2:5] == ["restarting", "(1x", "restarted)"]
        status_view.snapshot(cluster)  # both run again
        shot = status_view.snapshot(cluster)  # worker:1 failed for good, without training
        lines = table(shot, store.load(cluster.record.run_id))
        assert lines[1].split() == (
            "TASK ADDRESS STATE PID EXIT UPTIME LISTEN STEP STEPS/S GPUS CPUS LAST LINE".split()
        )
        assert cells(lines, "ps:0")[2:] == ["running", "1000", "-", "-", "yes", "-", "-", "none", "-"]
        assert cells(lines, "worker:0")[2:] == [
            *("running", "(1x", "restarted)", "1002", "-", "-", "yes", "300", "100", "0", "0-1", "step", "300")
        ]
        assert cells(lines, "worker:1")[2:13] == [
            *("failed", "(1x", "restarted)", "1001", "1", "-", "-", "-", "-", "0", "0-1")
        ]
        notes = "\n".join(lines[5:])
        assert "worker:1: " in notes and "  fix: " in notes  # its OOM, explained
        assert "worker:1: never logged a training step, while worker:0 did: it may not have trained" in notes
        assert shot.to_json(store.load(cluster.record.run_id))["tasks"][1]["gpus"] == [0]
        # As the run's live controller sends it through its socket, for the asking terminal to render.
        sent = status_view.Snapshot.from_plain(json.loads(json.dumps(shot.to_plain())))
        assert sent == shot and table(sent, store.load(cluster.record.run_id)) == lines
        cluster.stop()


def test_an_unreachable_host_is_a_state_with_its_duration_and_a_caption(tmp_path, fake_backend):
    store, cluster = started(write(tmp_path))
    with cluster:
        run_id = cluster.record.run_id
        since = time.time() - 75
        cluster.record = amend(store, run_id, unreachable={"h2": since})
        fake_backend.hosts["h2"].down = True
        shot = status_view.snapshot(cluster)
        lines = table(shot, store.load(run_id))
        clock = time.strftime("%H:%M:%S", time.localtime(since))
        assert cells(lines, "worker:1")[2:5] == ["unreachable", "(since", f"{clock},"]
        assert f"unreachable (since {clock}, 1m15s)" in next(line for line in lines if line.startswith("worker:1"))
        assert lines[-1] == "unreachable: h2: h2: connection refused"
        assert shot.to_json(store.load(run_id))["run"]["unreachable_hosts"] == {"h2": "h2: connection refused"}
        fake_backend.hosts["h2"].down = False
        cluster.stop()


def test_a_stop_that_left_something_says_what_and_where(capsys):
    report = StopReport(
        processes=1,
        remaining={"h1": [11, 12]},
        busy_ports={"h1:2222": [11]},
        hosts=2,
        ports=[2222],
        unreachable={"h2": "connection refused"},
    )
    assert (
        render.stop_summary(report)
        == "1 process stopped on 1 of 2 hosts (h2 could not be checked); 2 remain there; port 2222 NOT free there"
    )
    render.render_stop(report)
    assert capsys.readouterr().err.splitlines() == [
        "1 process stopped on 1 of 2 hosts (h2 could not be checked); 2 remain there; port 2222 NOT free there",
        "h1: still running: pids 11, 12",
        "h1:2222: still listening (pids 11)",
        "h2: could not be checked: connection refused",
    ]


@pytest.mark.parametrize(("seconds", "shown"), [(None, "-"), (59.9, "59s"), (75, "1m15s"), (3725, "1h02m")])
def test_durations_are_shown_in_their_largest_units(seconds, shown):
    assert status_table.duration(seconds) == shown


def test_log_lines_are_prefixed_and_a_failure_that_lasts_becomes_a_note(tmp_path, fake_backend, capsys):
    store, cluster = started(write(tmp_path))
    now = [0.0]
    with cluster:
        notes = LiveNotes(cluster, clock=lambda: now[0])
        prefix = Prefixer(["ps:0", "worker:0", "worker:1"], color=False)
        render.print_lines([("worker:1", "epoch 1"), ("worker:1", OOM)], prefix, notes)
        first = capsys.readouterr()
        assert first.out == f"[worker:1] epoch 1\n[worker:1] {OOM}\n" and first.err == ""  # not yet: it may pass
        now[0] += FAILURE_HOLD
        render.print_lines([("ps:0", "still serving")], prefix, notes)
        later = capsys.readouterr()
        assert later.out == "[ps:0]     still serving\n"
        assert later.err.startswith("worker:1: ") and "\n  fix: " in later.err
        cluster.stop()
