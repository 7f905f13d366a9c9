"""Nobody watching: `progress.on_stall` and `notify:` commands, decided by the run's controller.

Runs on the fake backend, in this process (as tests/test_fake_lifecycle.py): a stalled task warns
or fails the run; each event reaches the notify commands as JSON on stdin and `TFCTL_EVENT_*`
variables (the commands append both to files); a notify command that fails or hangs is reported
and changes nothing about the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_runs import FAKE_FILE, started, write
from tests.fakes import TaskScript
from tfctl.cluster.cluster import Cluster
from tfctl.controller.live import driver, notify
from tfctl.engine.clock import Cancel
from tfctl.engine.events import EventKind
from tfctl.engine.verdicts import STOPPED_BY_DOWN, Outcome
from tfctl.errors import StartupError
from tfctl.runs.store import RunStore
from tfctl.supervisor.procfs import proc_stat
from tfctl.supervisor.protocol import RunState, TaskState

APPEND = (
    'notify:\n  - cat >> events.jsonl\n  - echo "$TFCTL_EVENT_KIND $TFCTL_EVENT_TASK $TFCTL_EVENT_RUN_ID" >> env.txt\n'
)


def attach(cluster: Cluster, store: RunStore) -> driver.Ending:
    with cluster:
        return driver.attach(store, cluster, lambda _batch: None)


def events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def stalled_worker(fake_backend, worker0_ticks: int | None = 30) -> None:
    """worker:1 logged its last step 100 s ago (over stall_timeout: 60); worker:0 steps on."""
    fake_backend.scripts.update(
        {
            "worker:0": TaskScript(end_after=worker0_ticks, lines=["step 1", "step 2"]),
            "worker:1": TaskScript(lines=["step 1"], quiet_for=100.0),
        }
    )


def test_a_stalled_task_warns_sends_a_stalled_event_and_the_run_goes_on(tmp_path, fake_backend, capsys):
    stalled_worker(fake_backend)
    store, cluster = started(write(tmp_path, extra="progress: {stall_timeout: 60}\n" + APPEND), attached=True)
    run_id = cluster.record.run_id
    ending = attach(cluster, store)
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome
    warned = [line for line in capsys.readouterr().err.splitlines() if "stalled" in line]
    assert warned == [
        "warning: worker:1 on h2 stalled: no step for 100s (progress.stall_timeout 60s); "
        "the run goes on (progress.on_stall: warn)"
    ]  # once, though every poll sees it stalled
    sent = events(tmp_path)
    assert [e["kind"] for e in sent] == ["stalled", "succeeded"]
    stalled, succeeded = sent
    assert stalled["task"] == "worker:1" and stalled["host"] == "h2" and stalled["run_id"] == run_id
    assert stalled["cluster"] == "fake" and stalled["cluster_file"] == str(tmp_path / "cluster.yaml")
    assert "no step for 100s" in stalled["reason"]
    assert succeeded["reason"] == "worker:0 finished successfully" and succeeded["task"] is None
    assert (tmp_path / "env.txt").read_text().splitlines() == [f"stalled worker:1 {run_id}", f"succeeded  {run_id}"]


def test_a_second_end_keeps_the_first_ends_words_and_tells_nobody_twice(tmp_path, fake_backend):
    """A `down` answered through the door ends the run; the SIGTERM of the allocation it then
    releases reaches the controller, which ends the run again: the first words stay."""
    store, cluster = started(write(tmp_path, extra=APPEND), attached=True)
    with cluster:
        first = driver.finish(store, cluster, STOPPED_BY_DOWN)
        second = driver.finish(store, cluster, Outcome(RunState.STOPPED, "terminated (SIGTERM)"))
    assert first.record.reason == second.record.reason == "tfctl down"
    assert cluster.record == store.load(cluster.record.run_id) == second.record
    assert [(e["kind"], e["reason"]) for e in events(tmp_path)] == [("stopped", "tfctl down")]


def test_on_stall_fail_fails_the_run_naming_the_task_and_stops_the_rest(tmp_path, fake_backend):
    stalled_worker(fake_backend, worker0_ticks=300)  # without on_stall: fail, it would succeed (in seconds)
    text = write(tmp_path, extra="progress: {stall_timeout: 60, on_stall: fail}\n" + APPEND)
    store, cluster = started(text, attached=True)
    ending = attach(cluster, store)
    assert ending.outcome.state is RunState.FAILED and ending.outcome.culprit == "worker:1"
    assert ending.outcome.reason == (
        "worker:1 on h2 stalled: no step for 100s (progress.stall_timeout 60s); on_stall: fail"
    )
    assert store.load(cluster.record.run_id).state is RunState.FAILED
    for host, task in (("h1", "ps:0"), ("h1", "worker:0"), ("h2", "worker:1")):
        assert fake_backend.hosts[host].tasks[task].state is TaskState.STOPPED, task
    (failed,) = events(tmp_path)  # the failure says the stall: one event, not two
    assert failed["kind"] == "failed" and failed["task"] == "worker:1" and failed["host"] == "h2"
    assert failed["reason"] == ending.outcome.reason


def test_on_stall_restart_restarts_the_stalled_job_within_its_restart_policy(tmp_path, fake_backend, capsys):
    text = FAKE_FILE.replace("  worker: [h1:2223, h2:2222]\n", "  worker:\n    hosts: [h1:2223, h2:2222]\n")
    text += "    restart: {policy: exit-code, max_restarts: 1, backoff: 0}\n"
    fake_backend.scripts.update(
        {
            "worker:0": TaskScript(end_after=30, lines=["step 1"], after_restart=TaskScript(end_after=3)),
            "worker:1": TaskScript(lines=["step 1"], quiet_for=100.0, after_restart=TaskScript(lines=["step 2"])),
        }
    )
    store, cluster = started(
        write(tmp_path, text, "progress: {stall_timeout: 60, on_stall: restart}\n" + APPEND), attached=True
    )
    ending = attach(cluster, store)
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome  # the restarted job went on to its end
    assert [line for line in capsys.readouterr().err.splitlines() if "stalled" in line] == [
        "warning: worker:1 on h2 stalled: no step for 100s (progress.stall_timeout 60s); "
        "restarting worker:0, worker:1 (progress.on_stall: restart)"
    ]
    why = "stalled: no step for 100s (progress.stall_timeout 60s)"
    for host, task in (("h1", "worker:0"), ("h2", "worker:1")):
        assert fake_backend.hosts[host].tasks[task].earlier_ends == [why], task  # counted against max_restarts
    sent = events(tmp_path)
    assert [(e["kind"], e["task"]) for e in sent] == [
        ("stalled", "worker:1"),
        ("restarted", "worker:0"),
        ("restarted", "worker:1"),
        ("succeeded", None),
    ]
    assert sent[2]["reason"] == f"worker:1 on h2 {why}; restart 1 of 1"


def test_a_task_that_never_stalls_sends_only_the_end(tmp_path, fake_backend):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=5, lines=["step 1"])
    store, cluster = started(write(tmp_path, extra="progress: {stall_timeout: 60}\n" + APPEND), attached=True)
    assert attach(cluster, store).outcome.succeeded
    assert [e["kind"] for e in events(tmp_path)] == ["succeeded"]


def test_a_restart_sends_a_restarted_event(tmp_path, fake_backend):
    restart = "  chief:\n    hosts: [h2:2223]\n    restart: {policy: on-failure, max_restarts: 2, backoff: 0}\n"
    fake_backend.scripts["chief:0"] = TaskScript(end_after=3, exit_code=1, after_restart=TaskScript(end_after=2))
    store, cluster = started(write(tmp_path, FAKE_FILE + restart, APPEND), attached=True)
    assert attach(cluster, store).outcome.succeeded
    sent = events(tmp_path)
    assert [e["kind"] for e in sent] == ["restarted", "succeeded"]
    assert sent[0]["task"] == "chief:0" and sent[0]["reason"] == "chief:0 on h2 exited with code 1; restart 1 of 2"


def test_a_failing_notify_command_is_reported_and_the_run_is_unaffected(tmp_path, fake_backend, capsys):
    commands = (
        "notify:\n"
        "  - echo no webhook here; exit 3\n"
        "  - cat >> events.jsonl\n"  # the commands after it still run
    )
    fake_backend.scripts["worker:0"] = TaskScript(end_after=3)
    store, cluster = started(write(tmp_path, extra=commands), attached=True)
    ending = attach(cluster, store)
    assert ending.outcome.succeeded and store.load(cluster.record.run_id).state is RunState.SUCCEEDED
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notify:")]
    run = cluster.record.run_id
    assert said == [
        f"notify: `echo no webhook here; exit 3` exited with code 3: no webhook here (event succeeded of run {run})"
    ]
    assert [e["kind"] for e in events(tmp_path)] == ["succeeded"]


def test_a_hanging_notify_command_is_killed_at_its_timeout_and_the_next_one_still_runs(tmp_path):
    said: list[str] = []
    hung = ["echo $$ > hung.pid; exec sleep 60", "cat >> events.jsonl"]
    event = notify.RunEvent(EventKind.SUCCEEDED, "r1", "c", "/c.yaml", 1.0, "worker:0 finished successfully")
    with notify.Notifier(hung, tmp_path, said.append, timeout=0.5) as notifier:
        notifier.send(event)
    assert said == [
        "notify: `echo $$ > hung.pid; exec sleep 60` did not finish within 0.5s: killed (event succeeded of run r1)"
    ]
    assert proc_stat(int((tmp_path / "hung.pid").read_text())) is None  # killed and reaped, not left behind
    assert [e["kind"] for e in events(tmp_path)] == ["succeeded"]


def test_ctrl_c_sends_a_stopped_event(tmp_path, fake_backend):
    store, cluster = started(write(tmp_path, extra=APPEND), attached=True)  # runs until stopped
    stopping = Cancel()  # the edge turns Ctrl-C into a request on the run's token
    with cluster:
        driver.attach(store, cluster, lambda _batch: stopping.set("interrupted (Ctrl-C)"), stopping=stopping)
    (stopped,) = events(tmp_path)
    assert stopped["kind"] == "stopped" and stopped["reason"] == "interrupted (Ctrl-C)"


def test_a_command_that_cannot_start_is_reported(tmp_path):
    event = notify.RunEvent(notify.EventKind.FAILED, "r-1", "c", "/x/cluster.yaml", 0.0, "because")
    assert notify.run_command("true", event, tmp_path / "gone") == "could not start: No such file or directory"
    assert event.environment()["TFCTL_EVENT_TASK"] == "" and event.environment()["TFCTL_EVENT_KIND"] == "failed"
    assert os.environ.get("TFCTL_EVENT_KIND") is None  # only the command's environment has them


PEAK_OF_A_LOUD_COMMAND = """
import re
from tfctl.controller.live import notify
event = notify.RunEvent(notify.EventKind.FAILED, "r-1", "c", "/x/cluster.yaml", 0.0, "because")
loud = "head -c 300000000 /dev/zero | tr '\\\\0' x; echo; echo the end; exit 3"
print(notify.run_command(loud, event, None, timeout=60))
# this process's own peak (ru_maxrss would count the test process it was forked from)
print(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
"""


def test_a_command_printing_300_MB_costs_its_last_64_KiB_and_its_last_line_is_reported():
    done = subprocess.run(
        [sys.executable, "-c", PEAK_OF_A_LOUD_COMMAND], capture_output=True, text=True, timeout=120, check=True
    )
    failure, peak_kib = done.stdout.splitlines()
    assert failure == "exited with code 3: the end"
    assert int(peak_kib) < 150 * 1024, peak_kib  # not the 300 MB it printed


def test_a_failing_command_s_line_obeys_nothing_it_printed(tmp_path, capsys):
    event = notify.RunEvent(notify.EventKind.FAILED, "r-1", "c", "/x/cluster.yaml", 0.0, "because")
    with notify.Notifier([r"printf 'retitled\033]0;pwned\007\033[2J\n'; exit 1"], tmp_path) as notifier:
        notifier.send(event)
    said = capsys.readouterr().err
    assert "exited with code 1: retitled^[]0;pwned" in said and "\x1b" not in said, said


def test_a_run_whose_ps_exits_before_listening_sends_a_failed_event(tmp_path, fake_backend):
    fake_backend.scripts["ps:0"] = TaskScript(listen_after=None, end_after=2, exit_code=3)
    with pytest.raises(StartupError, match="ps:0 exited with code 3 before listening"):
        started(write(tmp_path, extra=APPEND))
    (failed,) = events(tmp_path)
    assert failed["kind"] == "failed" and failed["reason"].startswith("ps:0 exited with code 3 before listening")
    assert (tmp_path / "env.txt").read_text() == f"failed  {failed['run_id']}\n"


def test_events_are_made_in_one_place() -> None:
    """What reaches `notify:` is decided as `Notify` notices (the engine's, a run's end) and made
    into events only by `Notifier.tell`: no module builds a RunEvent of its own."""
    package = Path(notify.__file__).parents[2]
    making = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "RunEvent.of(" in path.read_text() or "RunEvent(" in path.read_text()
    )
    assert making == ["controller/live/notify.py"]
