"""`slurm: {controller: allocation}`: the run's controller in its allocation's batch script, on the
suite's real Slurm (`bench/slurm_lab.py`). The login side here is this test's own PID namespace;
the nodes are the lab's hosts, each in a PID namespace of its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.slurm_lab import URGENT, SlurmLab
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, kill_by_pid, marked_processes, no_warnings, spawn_tfctl
from tests.mlflow_server import needs_mlflow
from tests.test_slurm import fake_file, fake_slurm, on_slurm, run_processes, slurm  # noqa: F401 - the lab fixture
from tfctl.backends.slurm.backend import SlurmAllocation, SlurmBackend
from tfctl.backends.slurm.batch import ALLOCATION_ENV, COMMENT, BatchJob, batch_script, follow, submit_successor
from tfctl.engine.clock import FakeClock
from tfctl.engine.resubmission import AllocationOver
from tfctl.runs.record import RunRecord

BATCH = 'slurm: {partition: debug, time: "00:10:00", controller: allocation}'
RESUBMITTING = 'slurm: {partition: debug, time: "%s", controller: allocation, resubmit: 2}'


def batch_file(tmp_path: Path, sleep: float) -> Path:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        fake_file(sleep=sleep).replace('slurm: {partition: debug, time: "00:10:00", controller: login}', BATCH)
    )
    return cluster


def test_the_batch_script_runs_up_of_the_file_by_this_interpreter(tmp_path):
    from tfctl.config.loader import parse_config

    config = parse_config(
        fake_file().replace('slurm: {partition: debug, time: "00:10:00", controller: login}', BATCH), tmp_path / "c y"
    )
    script = batch_script(config)
    assert script.startswith("#!/bin/sh\n") and 'export TFCTL_CONTROLLER_JOB="$SLURM_JOB_ID"\n' in script
    assert script.endswith(f"-m tfctl -f '{(tmp_path / 'c y').resolve()}' up\n")
    resuming = batch_script(config, "r 1;x")  # `up --resume`: the run it continues, quoted
    assert resuming.endswith(f"-m tfctl -f '{(tmp_path / 'c y').resolve()}' up --resume 'r 1;x'\n")


def test_up_d_relays_the_batch_scripts_progress_until_its_tasks_run(tmp_path):
    job = BatchJob("9", tmp_path / "b.out", tmp_path / "b.err")
    job.out.write_text("[worker:0] not relayed with -d\n")
    lines = iter(
        [
            "",  # queued: nothing written yet
            "[  0.0s] slurm        the run's controller runs in job 9, on n1\nrun r-1: 2 tasks on 2 nodes\n",
            "[  0.4s] all 2 tasks r",  # a line half written is held back
            "unning\n",
        ]
    )

    def squeue(argv, stdin):
        if argv[0] == "squeue":  # the job's state, then the next piece of its batch script's stderr
            state = "9|PENDING|Priority|" if not job.err.exists() or not job.err.read_text() else "9|RUNNING|None|n1"
            with open(job.err, "a") as f:
                f.write(next(lines, ""))
            return subprocess.CompletedProcess(argv, 0, state, "")
        return subprocess.CompletedProcess(argv, 0, "n1", "")

    job.err.write_text("")
    out: list[str] = []
    err: list[str] = []
    assert follow(job, True, out.append, err.append, squeue, clock=FakeClock()) == 0
    assert out == ["r-1"]
    assert err[0] == "job 9 pending: waiting for resources: Priority (other jobs come first)"
    assert err[-2] == "[  0.4s] all 2 tasks running" and "runs in slurm job 9: this shell may end" in err[-1]


@pytest.mark.parametrize("successor_state", ["PENDING", "CANCELLED"])
def test_an_attached_up_relays_the_successor_that_took_the_run_up(tmp_path, successor_state):
    """The first job's controller handed the run over (its successor queued, then its allocation
    ended): `up` goes on relaying the successor's output; a successor the run's end cancelled is
    not followed."""
    first = BatchJob("9", tmp_path / "9.out", tmp_path / "9.err")
    second = BatchJob("10", tmp_path / "10.out", tmp_path / "10.err")
    first.err.write_text("[  0.1s] slurm        job 10 takes the run up if job 9 ends under it\n")
    first.out.write_text("[worker:0] worker0 checkpoint step 4\n")
    second.err.write_text("[  0.2s] slurm        slurm job 9 ended: PREEMPTED; the run goes on in allocation 2\n")
    second.out.write_text("[worker:0] worker0 resumed at step 4\n")
    looks = {"9": iter([""]), "10": iter(["10|RUNNING|None|n1"])}
    files = f"StdOut={second.out} StdErr={second.err}"
    fields = {  # what scontrol says of each job, in turn (the last, from then on)
        "9": ["JobId=9 JobState=PREEMPTED ExitCode=0:15"],
        "10": [f"JobId=10 JobState={successor_state} {files}", f"JobId=10 JobState=COMPLETED {files} ExitCode=0:0"],
    }

    def answer(argv, stdin):
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, next(looks[argv[2].removeprefix("--jobs=")], ""), "")
        if argv[-1] not in fields:  # the nodes of a node list
            return subprocess.CompletedProcess(argv, 0, argv[-1], "")
        said = fields[argv[-1]]
        return subprocess.CompletedProcess(argv, 0, said.pop(0) if len(said) > 1 else said[0], "")

    out: list[str] = []
    err: list[str] = []
    assert follow(first, False, out.append, err.append, answer, clock=FakeClock()) == 0
    followed = successor_state == "PENDING"
    assert ("[worker:0] worker0 resumed at step 4" in out) == followed, out
    assert ("slurm job 9 ended; the run goes on in slurm job 10" in err) == followed, err


@pytest.mark.parametrize("first_ran", [True, False])
def test_ctrl_c_while_the_next_allocation_is_queued_cancels_it_and_ends_the_run(tmp_path, first_ran):
    """Ctrl-C of an attached `up` while the job it follows is queued: the job is cancelled, and
    when a controller of the run ran before (this is its successor) the run's end is recorded
    here, since no controller of its is left to; a first job that never ran has no run yet."""
    first = BatchJob("9", tmp_path / "9.out", tmp_path / "9.err")
    second = BatchJob("10", tmp_path / "10.out", tmp_path / "10.err")
    first.err.write_text(
        "run mnist-1: 2 tasks on 2 hosts\n[  0.1s] slurm        job 10 takes the run up if job 9 ends under it\n"
        if first_ran
        else ""
    )
    for path in (first.out, second.out, second.err):  # made by tfctl when it submits each job
        path.write_text("")
    files = f"StdOut={second.out} StdErr={second.err}"
    states = {"9": "PREEMPTED" if first_ran else "PENDING", "10": "PENDING"}
    cancelled: list[str] = []
    looks: list[str] = []

    def answer(argv, stdin):
        if argv[0] == "scancel":
            cancelled.append(argv[-1])
            states[argv[-1]] = "CANCELLED"
            return subprocess.CompletedProcess(argv, 0, "", "")
        if argv[0] == "squeue":
            job = argv[2].removeprefix("--jobs=")
            if states[job] == "PENDING" and (job == "10" or not first_ran):
                looks.append(job)
                if len(looks) == 2:  # while the queued job is followed: the user's Ctrl-C
                    raise KeyboardInterrupt
            said = f"{job}|{states[job]}|Dependency|" if states[job] == "PENDING" else ""
            return subprocess.CompletedProcess(argv, 0, said, "")
        return subprocess.CompletedProcess(argv, 0, f"JobId={argv[-1]} JobState={states[argv[-1]]} {files}", "")

    abandoned: list[str] = []
    said: list[str] = []
    code = follow(first, False, said.append, said.append, answer, clock=FakeClock(), abandoned=abandoned.append)
    assert code == 130
    assert cancelled == (["10"] if first_ran else ["9"])
    assert abandoned == (["mnist-1"] if first_ran else [])


def test_a_successor_is_queued_to_take_the_run_up_only_if_the_allocation_fails(tmp_path, home, monkeypatch):
    from tfctl.config.loader import parse_config

    monkeypatch.setenv("TFCTL_HOME", str(home))
    monkeypatch.setenv(ALLOCATION_ENV, "2")  # this controller runs in the run's 2nd allocation
    config = parse_config(
        fake_file().replace('slurm: {partition: debug, time: "00:10:00", controller: login}', RESUBMITTING % 2),
        tmp_path / "c",
    )
    calls = []

    def sbatch(argv, stdin):
        calls.append((argv, stdin))
        return subprocess.CompletedProcess(argv, 0, "77\n", "")

    assert submit_successor(config, "fake-1", "76", sbatch).job_id == "77"
    ((argv, script),) = calls
    assert (
        "--dependency=afternotok:76" in argv and "--kill-on-invalid-dep=yes" in argv and f"--comment={COMMENT}" in argv
    )
    assert f"{ALLOCATION_ENV}=3\n" in script and script.endswith(" -m tfctl _take_up --run fake-1\n")


def inside_record(successor: str = "8", handed_over: str = "") -> RunRecord:
    allocation = SlurmAllocation("7", True, inside=True, successor=successor, handed_over=handed_over)
    return RunRecord("r", "fake", "/c.yaml", 1.0, (), (), 1.0, backend="slurm", backend_state=allocation.to_wire())


@pytest.mark.parametrize(
    ("record", "scontrol", "handed"),
    [
        (inside_record(), "JobId=7 JobState=COMPLETING Reason=TimeLimit", "TIMEOUT"),
        (inside_record(), "JobId=7 JobState=COMPLETING Reason=None PreemptTime=None", ""),  # a cancel: asked later
        # Preempted: said at once, so a successor queued past Slurm's MinJobAge needs no accounting.
        (inside_record(), "JobId=7 JobState=COMPLETING Reason=None PreemptTime=2026-11-28T12:24:11", "PREEMPTED"),
        (inside_record(), "JobId=7 JobState=RUNNING Reason=None PreemptTime=2026-11-28T12:24:11", "PREEMPTED"),
        (inside_record(), "JobId=7 JobState=RUNNING Reason=None", None),  # a `kill` of the controller by hand
        (inside_record(successor=""), "JobId=7 JobState=COMPLETING Reason=TimeLimit", None),  # no resubmit
    ],
)
def test_a_controller_ending_with_its_allocation_hands_the_run_to_its_queued_successor(
    monkeypatch, record, scontrol, handed
):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    run, _ = fake_slurm({"scontrol": [scontrol]})
    state = SlurmBackend(run).hand_over(record)
    assert (None if state is None else state["handed_over"]) == handed


@pytest.mark.parametrize(
    ("record", "scontrol", "sacct", "over"),
    [
        (inside_record(handed_over="TIMEOUT"), "", "", AllocationOver("TIMEOUT", True)),  # Slurm forgot: as said
        (inside_record(), "JobId=7 JobState=PREEMPTED Reason=None", "", AllocationOver("PREEMPTED", True)),
        (inside_record(), "JobId=7 JobState=CANCELLED Reason=None", "", AllocationOver("CANCELLED", False)),
        (inside_record(), "", "PREEMPTED", AllocationOver("PREEMPTED", True)),  # forgotten but for accounting
        (inside_record(), "", "!accounting storage is disabled", AllocationOver("GONE", False)),
    ],
)
def test_the_successor_reads_why_the_allocation_before_ended(monkeypatch, record, scontrol, sacct, over):
    monkeypatch.setenv("SLURM_JOB_ID", "8")  # the successor's own job
    run, _ = fake_slurm({"squeue": [""], "scontrol": [scontrol], "sacct": [sacct]})
    assert SlurmBackend(run).why_over(record, lambda *_: None) == over


@pytest.mark.parametrize("controller", ["7", None])  # the controller itself; `down` from a login node
def test_the_runs_end_cancels_the_queued_successor_before_its_allocation_ends(monkeypatch, controller):
    if controller:
        monkeypatch.setenv("SLURM_JOB_ID", controller)
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run, calls = fake_slurm(
        {"scancel": [""], "squeue": [""], "scontrol": ["JobId=8 JobState=CANCELLED"], "sacct": [""]}
    )
    SlurmBackend(run).release(inside_record())
    cancels = [argv[1] for argv in calls if argv[0] == "scancel"]
    assert cancels == (["8"] if controller else ["8", "7"])  # (the controller's own: its script's end)


def login_side(run_id: str, job: str) -> list[int]:
    """Processes of the run in this (the login node's) PID namespace, its tasks' and its sruns
    into the job alike: none should be."""
    mine = os.readlink("/proc/self/ns/pid")
    sruns = [int(p) for p in os.listdir("/proc") if p.isdigit() and f"--jobid={job}" in _cmdline(int(p))]
    return [pid for pid in [*run_processes_any(run_id), *sruns] if _pid_ns(pid) == mine]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def run_processes_any(run_id: str) -> list[int]:
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


def _pid_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def hide_the_door(home: Path, run_id: str) -> None:
    """The controller's Unix socket sits in the shared home, but is only for its own host: move it
    away, so that a login-side verb that used it would fail."""
    for door in home.glob(f"**/{run_id}/control.sock"):
        door.rename(door.with_name("control.sock.hidden"))


@pytest.mark.netns
def test_a_run_whose_controller_is_in_its_allocation_needs_no_login_side_process(slurm, tmp_path, home):  # noqa: F811
    cluster = batch_file(tmp_path, sleep=8)
    began = time.monotonic()
    up = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    took = time.monotonic() - began
    assert up.returncode == 0, up.stderr
    no_warnings(up.stderr)
    run_id = up.stdout.strip().splitlines()[-1]
    (job,) = slurm.jobs()
    assert f"the run's controller runs in job {job}, on tfh0" in up.stderr and "all 3 tasks running" in up.stderr
    said = slurm.run(["squeue", "--noheader", f"--jobs={job}", "--format=%j|%k"]).stdout.strip()
    assert said == f"tfctl-fake|{COMMENT}"  # recognisable as tfctl's
    print(f"up -d to all tasks running, controller in the allocation: {took:.2f} s")
    # Every login-side process (tfctl, srun) gone: here there is none left to SIGKILL.
    kill_by_pid(login_side(run_id, job))
    assert login_side(run_id, job) == [] and run_processes_any(run_id)
    hide_the_door(home, run_id)
    shown = json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)
    assert shown["run"]["slurm"]["inside"] is True and shown["run"]["slurm"]["job_id"] == job
    assert {t["task"]: t["host"] for t in shown["tasks"]} == {"ps:0": "tfh0", "worker:0": "tfh1", "worker:1": "tfh2"}
    logs = on_slurm(slurm, home, "-f", str(cluster), "logs")
    assert logs.returncode == 0 and "[worker:1] worker1 line 4" in logs.stdout
    run = wait_until(
        lambda: json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)["run"],
        60,
        "the run's end",
        until=lambda run: run["state"] != "running",
        interval=1,
    )
    assert run["state"] == "succeeded", run
    wait_until(lambda: slurm.jobs() == [], 30, "the allocation released", interval=0.5)
    wait_until(lambda: run_processes(slurm, run_id) == [], 10, "no process of the run left", interval=0.2)


def on_login_node(lab: SlurmLab, home: Path, door: Path, *args: str) -> subprocess.CompletedProcess:
    """`tfctl` as on a login node. The controller's door is a Unix socket in the shared home, only
    for its own host; on the lab every node shares this kernel, so the socket is covered by
    /dev/null in this process's own mount namespace (the nodes still see it)."""
    cover = 'mount --bind /dev/null "$0" && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cover, str(door)]
        + [sys.executable, "-m", "tfctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TFCTL_HOME": str(home), **lab.env()},
    )


def traced(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.netns
def test_status_and_down_from_the_login_side_reach_the_controller_through_the_allocation(
    slurm,  # noqa: F811
    tmp_path,
    home,
):
    """`status` and `down` ask the run's controller at its door, through a job step beside it
    on the batch host (`srun --overlap`): it stops the tasks and says what it stopped; then
    `down` releases the allocation. Nothing is asked of the nodes from the login side."""
    cluster = batch_file(tmp_path, sleep=300)
    up = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip().splitlines()[-1]
    (job,) = slurm.jobs()
    # `up -d` returns once the batch script's `up` said its tasks run; its door opens a moment later.
    (door,) = wait_until(lambda: list(home.glob(f"**/{run_id}/control.sock")), 30, "the controller's door")
    seen = tmp_path / "status.trace"
    status = on_login_node(slurm, home, door, "--trace", str(seen), "-f", str(cluster), "status", "--json")
    assert status.returncode == 0, status.stderr
    assert {t["state"] for t in json.loads(status.stdout)["tasks"]} == {"running"}
    stopped = tmp_path / "down.trace"
    down = on_login_node(slurm, home, door, "--trace", str(stopped), "-f", str(cluster), "down")
    assert down.returncode == 0, down.stderr
    assert "0 remain" in down.stderr and f"slurm job {job}: " in down.stderr, down.stderr
    for trace, verb in ((seen, "status"), (stopped, "down")):
        events = traced(trace)
        assert [(e["verb"], e.get("relayed")) for e in events if e["event"] == "live.ask"] == [(verb, True)]
        assert [e["event"] for e in events if e["event"].startswith(("agent.", "cluster."))] == []
    assert slurm.jobs() == [] and slurm.steps() == []
    wait_until(lambda: run_processes(slurm, run_id) == [], 10, "no process of the run left", interval=0.2)
    shown = json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)
    assert (shown["run"]["state"], shown["run"]["reason"]) == ("stopped", "tfctl down"), shown["run"]


@pytest.mark.netns
def test_an_attached_up_relays_the_batch_scripts_run_and_exits_with_it(slurm, tmp_path, home):  # noqa: F811
    cluster = batch_file(tmp_path, sleep=1)
    up = on_slurm(slurm, home, "-f", str(cluster), "up")
    assert up.returncode == 0, up.stderr
    assert "submitted slurm job" in up.stderr and "job succeeded: worker:0 finished successfully" in up.stderr
    assert "[worker:0] worker0 line 4" in up.stdout  # the tasks' lines, on stdout as attached
    assert slurm.jobs() == []
    output = list((home / "slurm").glob("fake-*.err"))
    assert output and all(path.stat().st_mode & 0o777 == 0o600 for path in output)


# -- resubmission: the controller dies with its allocation; the successor it queued takes up the run

STEPS = 95  # a step a second: more than a one-minute allocation gives (Slurm ends it within 90 s)
TIMED = """\
name: long
backend: slurm
slurm: {time: "1", resubmit: 2, controller: allocation}
command: "{python} %(task)s --name {job_name}{task_index} --port -1 --checkpoint --until %(steps)d --step-every %(ev)s"
grace_period: 2
jobs:
  worker: {count: 2, port: 2222}
"""


def resubmitted_run(lab: SlurmLab, home: Path, cluster: Path, run_id: str, within: float) -> dict:
    """The run's `status --json` in a fresh process once it is over; nothing of it left."""
    run = wait_until(
        lambda: json.loads(on_slurm(lab, home, "-f", str(cluster), "status", "--json").stdout)["run"],
        within,
        "the run's end",
        until=lambda run: run["state"] not in ("starting", "running"),
        interval=2,
    )
    wait_until(lambda: lab.jobs() == [], 30, "every allocation and successor gone", interval=0.5)
    wait_until(lambda: run_processes(lab, run_id) == [], 10, "no process of the run left", interval=0.2)
    return run


def batch_output(home: Path) -> str:
    """What each batch script's `up` said, for a failure's message."""
    return "\n".join(f"== {path.name}\n{path.read_text()[-1500:]}" for path in sorted(home.glob("slurm/*.err")))


def resumed_at(home: Path, run_id: str) -> int:
    """The step the 2nd allocation's worker:0 resumed at (its node's log: the 1st's, on another
    node, or set aside on the same one, says nothing of it)."""
    logs = [path.read_text() for path in home.glob(f"hosts/*/tasks/{run_id}/worker-0/output.log")]
    found = [int(step) for log in logs for step in re.findall(r"worker0 resumed at step (\d+)", log)]
    assert len(found) == 1, logs
    return found[0]


@pytest.mark.netns
def test_a_run_outlives_its_time_limit_in_the_allocation_its_controller_queued(slurm, tmp_path, home):  # noqa: F811
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(TIMED % {"task": FAKE_TASK, "steps": STEPS, "ev": 1})
    up = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip().splitlines()[-1]
    first, successor = sorted(slurm.jobs(), key=int)
    assert f"job {successor} takes the run up if job {first} ends under it" in up.stderr, up.stderr
    began = time.monotonic()
    following = spawn_tfctl("-f", str(cluster), "logs", "-f", "worker:1", home=home, env=slurm.env())
    try:
        run = resubmitted_run(slurm, home, cluster, run_id, 240)
        followed = following.communicate(timeout=30)
    finally:
        if following.poll() is None:
            following.kill()
            following.wait()
    print(f"\nlogs -f: exit {following.returncode}; {followed[1].strip()}; {len(followed[0].splitlines())} lines")
    print(f"\ntime limit: run {run['state']} {time.monotonic() - began:.0f}s after up -d")
    assert run["state"] == "succeeded", (run["reason"], batch_output(home))
    assert [end["why"] for end in run["allocations"]["ended"]] == ["TIMEOUT"]
    assert 0 < resumed_at(home, run_id) < STEPS
    assert (home / "work" / run_id / "checkpoints" / "worker0").read_text() == str(STEPS)  # the decisive task
    shown = on_slurm(slurm, home, "-f", str(cluster), "status")
    assert "succeeded" in shown.stdout and "allocation 2 of 3 (1st ended: TIMEOUT" in shown.stdout, shown.stdout
    # `logs -f` followed the run across the gap: worker:1's lines of both allocations, then it ended with the run.
    assert following.returncode == 0 and "the run goes on in allocation 2" in followed[1], followed[1]
    assert "worker1 checkpoint step 5\n" in followed[0] and "worker1 resumed at step" in followed[0], followed[0][
        -2000:
    ]
    # worker1 is stopped once worker0 is done: it may be a step behind then (CI saw 94).
    steps = [int(n) for n in re.findall(r"worker1 checkpoint step (\d+)\n", followed[0].split("worker1 resumed")[1])]
    assert steps and steps[-1] >= STEPS - 10, followed[0][-2000:]


@pytest.mark.netns
def test_a_preempted_allocation_hands_the_run_to_its_successor(slurm, tmp_path, home):  # noqa: F811
    """Attached: the login node's `up` relays the first batch job, then its successor's, and
    exits with the run's end."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(TIMED.replace('time: "1"', 'time: "10"') % {"task": FAKE_TASK, "steps": 30, "ev": 0.5})
    up = spawn_tfctl("-f", str(cluster), "up", home=home, env=slurm.env())
    try:
        found = wait_until(lambda: list(home.glob("work/*/checkpoints/worker0")), 60, "worker0's checkpoint")
        saved = found[0]
        wait_until(lambda: int(saved.read_text() or 0) >= 4, 60, "worker0 at step 4", interval=0.2)
        urgent = slurm.run(
            ["sbatch", "-p", URGENT, "-w", "tfh0", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 4", "--parsable"]
        )
        assert urgent.returncode == 0, urgent.stderr
        began = time.monotonic()
        # The dying controller records the preemption (Slurm's PreemptTime) while the node is taken:
        # its successor needs neither scontrol, which forgets after MinJobAge, nor accounting.
        record = home / "runs" / saved.parent.parent.name / "run.json"
        handed = wait_until(
            lambda: (json.loads(record.read_text()).get("backend_state") or {}).get("handed_over"),
            30,
            "the controller's hand-over",
            interval=0.1,
        )
        assert handed == "PREEMPTED"
        out, err = up.communicate(timeout=180)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    run_id = saved.parent.parent.name
    run = resubmitted_run(slurm, home, cluster, run_id, 30)
    print(f"\npreempted: attached up exited {up.returncode} {time.monotonic() - began:.0f}s after the preemption")
    assert up.returncode == 0 and run["state"] == "succeeded", (run["reason"], err[-3000:])
    assert re.search(r"slurm job \d+ ended; the run goes on in slurm job \d+", err), err[-3000:]
    assert "[worker:0] worker0 resumed at step" in out and "[worker:1] worker1 checkpoint step 30" in out, out[-3000:]
    assert [end["why"] for end in run["allocations"]["ended"]] == ["PREEMPTED"]
    assert resumed_at(home, run_id) >= 4 and saved.read_text() == "30"
    shown = on_slurm(slurm, home, "-f", str(cluster), "status")
    assert "succeeded" in shown.stdout and "allocation 2 of 3 (1st ended: PREEMPTED" in shown.stdout, shown.stdout


@pytest.mark.netns
def test_down_leaves_no_queued_successor(slurm, tmp_path, home):  # noqa: F811
    cluster = batch_file(tmp_path, sleep=300)
    cluster.write_text(cluster.read_text().replace("controller: allocation}", "controller: allocation, resubmit: 2}"))
    up = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip().splitlines()[-1]
    assert len(slurm.jobs()) == 2  # the allocation, and its successor waiting on it
    down = on_slurm(slurm, home, "-f", str(cluster), "down")
    assert down.returncode == 0, down.stderr
    wait_until(lambda: slurm.jobs() == [], 30, "the allocation and its successor gone", interval=0.5)
    wait_until(lambda: run_processes(slurm, run_id) == [], 10, "no process of the run left", interval=0.2)
    shown = json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)
    assert (shown["run"]["state"], shown["run"]["reason"]) == ("stopped", "tfctl down"), shown["run"]


@pytest.mark.netns
def test_up_resume_runs_the_continued_runs_controller_in_an_allocation_of_its_own(slurm, tmp_path, home):  # noqa: F811
    """`up --resume` with `controller: allocation`: the continued run's controller is in a batch
    job too, and its tasks count on from the checkpoints of the run `down` stopped."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        TIMED.replace('time: "1", resubmit: 2,', 'time: "10",') % {"task": FAKE_TASK, "steps": 12, "ev": 0.5}
    )
    first = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    assert first.returncode == 0, first.stderr
    saved = home / "work" / first.stdout.strip().splitlines()[-1] / "checkpoints" / "worker0"
    wait_until(lambda: saved.exists() and int(saved.read_text() or 0) >= 3, 60, "worker0 at step 3", interval=0.2)
    assert on_slurm(slurm, home, "-f", str(cluster), "down").returncode == 0
    wait_until(lambda: slurm.jobs() == [], 30, "the first allocation released", interval=0.5)
    stopped_at = int(saved.read_text())
    resumed = on_slurm(slurm, home, "-f", str(cluster), "up", "--resume", "-d")
    assert resumed.returncode == 0, resumed.stderr
    (job,) = slurm.jobs()
    assert f"the run's controller runs in job {job}" in resumed.stderr, resumed.stderr
    run_id = resumed.stdout.strip().splitlines()[-1]
    run = resubmitted_run(slurm, home, cluster, run_id, 120)
    assert run["state"] == "succeeded" and run["slurm"]["inside"] is True, (run, batch_output(home))
    assert run_id != saved.parent.parent.name and resumed_at(home, run_id) == stopped_at < 12
    assert (home / "work" / run_id / "checkpoints" / "worker0").read_text() == "12"
    assert saved.read_text() == str(stopped_at)  # the stopped run's own checkpoint stays as it was


@pytest.fixture(scope="module")
def mlflow_on_lab(slurm, tmp_path_factory):  # noqa: F811
    """An MLflow server on the lab's bridge, where the allocations' controllers reach it."""
    from tests.mlflow_server import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow-slurm"), host=slurm.lab.gateway) as server:
        yield server


@pytest.mark.netns
@needs_mlflow
def test_a_preempted_runs_successor_logs_into_the_same_mlflow_run(slurm, mlflow_on_lab, tmp_path, home):  # noqa: F811
    cluster = tmp_path / "cluster.yaml"
    tracked = f'tracking: {{mlflow: {{uri: "{mlflow_on_lab.uri}", experiment: resubmitted}}}}\n'
    cluster.write_text(TIMED.replace('time: "1"', 'time: "10"') % {"task": FAKE_TASK, "steps": 20, "ev": 0.5} + tracked)
    up = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip().splitlines()[-1]
    saved = wait_until(lambda: list(home.glob(f"work/{run_id}/checkpoints/worker0")), 60, "worker0's checkpoint")[0]
    wait_until(lambda: int(saved.read_text() or 0) >= 4, 60, "worker0 at step 4", interval=0.2)
    (made,) = mlflow_on_lab.runs("resubmitted")
    assert made["status"] == "RUNNING"
    urgent = slurm.run(
        ["sbatch", "-p", URGENT, "-w", "tfh0", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 4", "--parsable"]
    )
    assert urgent.returncode == 0, urgent.stderr
    run = resubmitted_run(slurm, home, cluster, run_id, 120)
    assert run["state"] == "succeeded" and [e["why"] for e in run["allocations"]["ended"]] == ["PREEMPTED"], (
        run["reason"],
        batch_output(home),
    )
    (same,) = mlflow_on_lab.runs("resubmitted")  # the successor's controller made no run of its own
    assert same["id"] == made["id"] and same["status"] == "FINISHED", batch_output(home)
    assert same["tags"]["tfctl.run_id"] == run_id and same["tags"]["tfctl.state"] == "succeeded"
    record = RunRecord.from_json(json.loads((home / "runs" / run_id / "run.json").read_text()))
    assert {t.env["MLFLOW_RUN_ID"] for t in record.tasks} == {made["id"]}  # the second allocation's tasks
    assert run["tracking"][0]["run_id"] == made["id"]
