"""A run that outlives its allocation (`slurm: {resubmit: N}`): the decisions on the fake backend
and a fake Slurm, then a whole run through three one-minute allocations of a real Slurm."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from bench.slurm_lab import URGENT, SlurmLab
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, spawn_tfctl
from tests.fake_runs import FAKE_FILE, amend, started, tfctl_here, write
from tests.fakes import TaskScript
from tests.test_slurm import fake_slurm, on_slurm, run_processes, slurm  # noqa: F401 - the lab fixture
from tfctl.backends.slurm.allocation import sbatch_argv, time_left
from tfctl.backends.slurm.backend import SlurmAllocation, SlurmBackend
from tfctl.cluster.cluster import Cluster
from tfctl.config.loader import parse_config
from tfctl.controller.live import driver
from tfctl.controller.live.resubmit import next_allocation
from tfctl.engine.clock import FakeClock
from tfctl.engine.resubmission import AllocationOver
from tfctl.runs.record import AllocationEnd, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor import files, tasks
from tfctl.supervisor import protocol as p
from tfctl.supervisor.errors import AgentError
from tfctl.supervisor.protocol import RunState

RESUBMITTING = FAKE_FILE.replace("fake: {pool: gpus}", "fake: {pool: gpus, resubmit: %d}")


def watch(cluster: Cluster, store: RunStore) -> driver.Ending:
    with cluster:
        ending = driver.attach(store, cluster, lambda _lines: None)
    return ending


def end_each_lease(fake_backend, run_id: str, whys: list[str]) -> list[str]:
    """The fake pool ends the run's lease by each of `whys` in turn (the first at once, each next
    once the run started again); the `again` of every start the hosts were asked for."""
    agains: list[str] = []
    fake_backend.end_run(run_id, whys.pop(0))

    def on_start(request: p.Request) -> None:
        if isinstance(request, p.StartRequest) and request.again:
            agains.append(request.again)
            if whys:
                fake_backend.end_run(run_id, whys.pop(0))
            else:  # the last lease holds: the worker finishes in it
                fake_backend.scripts["worker:0"] = TaskScript(end_after=2)

    fake_backend.agent("h1").before = on_start
    return agains


def test_a_lease_ended_by_its_time_limit_or_preemption_moves_the_run_into_a_new_one(tmp_path, fake_backend):
    path = write(tmp_path, RESUBMITTING % 2)
    store, cluster = started(path, attached=True)
    run_id = cluster.record.run_id
    assert "fake pool: leased  allocation 1 of 3\n" in tfctl_here("-f", str(path), "status").out
    agains = end_each_lease(fake_backend, run_id, ["TIMEOUT", "PREEMPTED"])
    ending = watch(cluster, store)
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome
    assert agains == ["allocation1", "allocation2"]  # the tasks started afresh on the hosts, twice
    assert fake_backend.acquired == [run_id] * 3 and fake_backend.released == [run_id]
    record = store.load(run_id)
    assert [(end.label, end.why) for end in record.allocations] == [
        ("fake pool", "TIMEOUT"),
        ("fake pool", "PREEMPTED"),
    ]
    assert record.state is RunState.SUCCEEDED and record.left_nothing
    shown = tfctl_here("-f", str(path), "status", "--json")
    assert [end["why"] for end in json.loads(shown.out)["run"]["allocations"]["ended"]] == ["TIMEOUT", "PREEMPTED"]
    text = record.allocation_text()
    assert text is not None and re.fullmatch(
        r"allocation 3 of 3 \(1st ended: TIMEOUT at \d\d:\d\d; 2nd ended: PREEMPTED at \d\d:\d\d\)", text
    )


def test_an_attached_up_streams_every_allocations_tasks_and_ends_with_the_last(tmp_path, fake_backend):
    path = write(tmp_path, RESUBMITTING % 2)
    store, cluster = started(path, attached=True)
    fake_backend.scripts["worker:1"] = TaskScript(lines=["first allocation"])
    agains = end_each_lease(fake_backend, cluster.record.run_id, ["TIMEOUT", "PREEMPTED"])
    before = fake_backend.agent("h1").before

    def say_which(request: p.Request) -> None:
        if isinstance(request, p.StartRequest) and request.again:
            fake_backend.scripts["worker:1"] = TaskScript(lines=[f"started for {request.again}"])
        before(request)

    fake_backend.agent("h1").before = say_which
    lines: list[tuple[str, str]] = []
    with cluster:
        ending = driver.attach(store, cluster, lines.extend)
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome
    assert agains == ["allocation1", "allocation2"]
    said = [line for task, line in lines if task == "worker:1"]  # (the 2nd allocation ends as it starts)
    assert said[0] == "first allocation" and said[-1] == "started for allocation2", said
    assert said.count("first allocation") == said.count("started for allocation2") == 1, said
    assert all(line in ("first allocation", "started for allocation1", "started for allocation2") for line in said), (
        said
    )


def test_resubmissions_stop_at_the_limit_and_never_follow_a_cancel(tmp_path, fake_backend):
    store, cluster = started(write(tmp_path, RESUBMITTING % 1), attached=True)
    run_id = cluster.record.run_id
    end_each_lease(fake_backend, run_id, ["TIMEOUT", "TIMEOUT"])
    ending = watch(cluster, store)
    assert ending.outcome.state is RunState.FAILED and ending.outcome.reason == f"the fake pool ended run {run_id}"
    assert len(store.load(run_id).allocations) == 1 and fake_backend.acquired == [run_id] * 2

    store, cluster = started(write(tmp_path, RESUBMITTING % 3), attached=True)
    end_each_lease(fake_backend, cluster.record.run_id, ["CANCELLED"])
    assert watch(cluster, store).outcome.state is RunState.FAILED
    assert store.load(cluster.record.run_id).allocations == ()


def test_a_run_without_resubmit_ends_with_its_lease_and_says_nothing_of_allocations(tmp_path, fake_backend):
    store, cluster = started(write(tmp_path), attached=True)
    fake_backend.end_run(cluster.record.run_id, "TIMEOUT")
    assert watch(cluster, store).outcome.state is RunState.FAILED
    record = store.load(cluster.record.run_id)
    assert record.allocations == () and record.allocation_text() is None and len(fake_backend.acquired) == 1


def test_an_older_record_without_allocations_still_loads():
    data = {"run_id": "r", "cluster_name": "c", "cluster_file": "/c.yaml", "created_at": 1.0}
    record = RunRecord.from_json({**data, "schema_version": 2, "tasks": [], "hosts": [], "grace_period": 1.0})
    assert record.allocations == () and record.resubmits == 0


def test_a_host_starts_a_task_of_a_later_allocation_afresh_keeping_the_earlier_state_aside(tmp_path):
    root, launch = str(tmp_path), p.TaskLaunch("worker:0", "true")
    tasks.start(root, p.StartRequest("r", [launch], spawn=False))
    with pytest.raises(AgentError, match="already started"):
        tasks.start(root, p.StartRequest("r", [launch], spawn=False))
    tasks.start(root, p.StartRequest("r", [launch], spawn=False, again="allocation1"))
    here = Path(files.run_dir(root, "r"))
    assert (here / "worker-0" / "spec.json").exists() and (here / "allocation1" / "worker-0" / "spec.json").exists()
    stopped = tasks.stop(root, p.StopRequest("r", 0))
    assert list(stopped.tasks) == ["worker:0"]  # the earlier allocation's state is no task


# -- Slurm's side, with a fake Slurm ---------------------------------------------------------------

SLURM_FILE = """\
name: fake
backend: slurm
slurm: {time: "1", resubmit: 2, signal_before: 10, controller: login}
command: "sleep 1"
jobs:
  worker: {count: 2, port: 2222}
"""


def slurm_record(signal_before: int = 10, owned: bool = True) -> RunRecord:
    allocation = SlurmAllocation("41", owned, {}, signal_before)
    return RunRecord("r", "fake", "/c.yaml", 1.0, (), (), 1.0, backend="slurm", backend_state=allocation.to_wire())


def test_slurm_is_asked_to_signal_the_steps_before_the_limit():
    argv = sbatch_argv(parse_config(SLURM_FILE, Path("c.yaml")), "tfctl-r")
    assert "--signal=TERM@10" in argv and "--time=1" in argv


@pytest.mark.parametrize(("said", "seconds"), [("0:42", 42), ("1:02:03", 3723), ("2-00:00:01", 172801), ("", None)])
def test_time_left_as_squeue_says_it(said, seconds):
    run, _ = fake_slurm({"squeue": [said or "UNLIMITED"]})
    assert time_left("41", run) == seconds


TIMED_OUT = "JobId=41 JobState=TIMEOUT Reason=TimeLimit"


@pytest.mark.parametrize(
    ("squeue", "scontrol", "waiting"),
    [
        (
            ["41|RUNNING|None|n[1-2]", "0:30", ""],
            ["n1\nn2", TIMED_OUT],
            "job 41: the tasks ended 30s before its time limit; waiting for its end",
        ),
        (  # killed at the limit
            ["41|COMPLETING|None|n[1-2]", ""],
            ["n1\nn2", TIMED_OUT],
            "job 41 is ending; waiting for Slurm to say why",
        ),
        ([""], [TIMED_OUT], None),  # over already
    ],
)
def test_a_time_limit_continues_the_run_waited_for_when_the_tasks_ended_just_before(squeue, scontrol, waiting):
    run, _ = fake_slurm({"squeue": squeue, "scontrol": scontrol})
    said: list[str] = []
    over = SlurmBackend(run, clock=FakeClock()).why_over(slurm_record(), lambda _who, what: said.append(what))
    assert over == AllocationOver("TIMEOUT", continues=True)
    assert said == [*([waiting] if waiting else []), "job 41 ended: TIMEOUT (TimeLimit)"]


@pytest.mark.parametrize(
    ("squeue", "scontrol", "record", "over"),
    [
        (["41|RUNNING|None|n1", "50:00"], ["n1"], slurm_record(), None),  # the tasks failed long before the limit
        (["41|RUNNING|None|n1", "0:30"], ["n1"], slurm_record(signal_before=0), None),  # nobody signalled them
        ([""], ["JobId=41 JobState=CANCELLED Reason=None"], slurm_record(), AllocationOver("CANCELLED", False)),
        ([""], ["JobId=41 JobState=NODE_FAIL Reason=None"], slurm_record(), AllocationOver("NODE_FAIL", False)),
        ([""], ["JobId=41 JobState=PREEMPTED Reason=None"], slurm_record(), AllocationOver("PREEMPTED", True)),
        (  # an allocation tfctl runs inside is its owner's: never followed by one of tfctl's
            [""],
            ["JobId=41 JobState=TIMEOUT Reason=TimeLimit"],
            slurm_record(owned=False),
            AllocationOver("TIMEOUT", False),
        ),
    ],
)
def test_only_a_time_limit_or_preemption_of_tfctls_own_allocation_continues_the_run(squeue, scontrol, record, over):
    run, calls = fake_slurm({"squeue": squeue, "scontrol": scontrol})
    assert SlurmBackend(run).why_over(record, lambda *_: None) == over
    assert {c[0] for c in calls} <= {"squeue", "scontrol"}  # nothing asked of Slurm but its state


# -- a whole run on a real Slurm ------------------------------------------------------------------


def status_json(lab: SlurmLab, home: Path, cluster: Path) -> dict:
    return json.loads(on_slurm(lab, home, "-f", str(cluster), "status", "--json").stdout)


def once_over(lab: SlurmLab, home: Path, cluster: Path, within: float, every: float) -> dict:
    """The run's `status --json` object once it is no longer starting or running, or after `within` s."""
    began = time.monotonic()
    run = status_json(lab, home, cluster)["run"]
    while run["state"] in ("starting", "running") and time.monotonic() - began < within:
        threading.Event().wait(every)
        run = status_json(lab, home, cluster)["run"]
    return run


PREEMPTIBLE = """\
name: preempted
backend: slurm
slurm: {time: "10", resubmit: 2, controller: login}
command: "{python} %(task)s --name {job_name}{task_index} --port -1 --checkpoint --until %(steps)d --step-every 0.5"
grace_period: 2
jobs:
  worker: {count: 2, port: 2222}
"""


@pytest.mark.netns
def test_a_preempted_allocation_moves_the_run_into_a_new_one_that_resumes(slurm, tmp_path, home):  # noqa: F811
    """Another job of a higher priority tier takes a node of the run's allocation: Slurm cancels
    the allocation (PREEMPTED), and the run goes on in a new one once nodes are free again."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(PREEMPTIBLE % {"task": FAKE_TASK, "steps": 40})
    up = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    saved = home / "work" / run_id / "checkpoints" / "worker0"
    wait_until(lambda: saved.exists() and int(saved.read_text() or 0) >= 4, 120, "worker0 at step 4", interval=0.2)

    following = spawn_tfctl("-f", str(cluster), "logs", "-f", "worker:1", home=home, env=slurm.env())
    at = time.time()
    preempt(slurm, home, cluster, "worker:0")
    try:
        run = once_over(slurm, home, cluster, 240, every=1)
        followed = following.communicate(timeout=30)
    finally:
        if following.poll() is None:
            following.kill()
            following.wait()
    ends = [f"{end['why']} at +{end['ended_at'] - at:.0f}s" for end in run["allocations"]["ended"]]
    print(f"\npreempted: allocation ended {', '.join(ends)}; run {run['state']} at +{time.time() - at:.0f}s")
    watched = next(home.glob(f"runs/{run_id}/watch.log"), None)
    assert run["state"] == "succeeded", (run["reason"], watched.read_text()[-3000:] if watched else "")
    assert [end["why"] for end in run["allocations"]["ended"]] == ["PREEMPTED"]
    # The 2nd allocation's worker:0: on the node the 1st had it on (whose earlier life was set
    # aside), or on another, beside the 1st allocation's log: the newest.
    log = max(home.glob(f"hosts/*/tasks/{run_id}/worker-0/output.log"), key=lambda path: path.stat().st_mtime)
    resumed = re.search(r"worker0 resumed at step (\d+)", log.read_text())
    assert resumed is not None and int(resumed.group(1)) >= 4, log.read_text()[-2000:]
    assert saved.read_text() == "40"
    assert slurm.jobs() == [] and run_processes(slurm, run_id) == []
    # `logs -f` followed worker:1 across the gap, into the new allocation, and ended with the run.
    assert following.returncode == 0 and "the run goes on in allocation 2" in followed[1], followed[1]
    assert "worker1 resumed at step" in followed[0] and "worker1 checkpoint step 40\n" in followed[0], followed[0][
        -2000:
    ]


def preempt(lab: SlurmLab, home: Path, cluster: Path, task: str) -> None:
    """A job of a higher priority tier takes the node `task` runs on: Slurm cancels the run's
    allocation (PREEMPTED)."""
    node = next(t["host"] for t in status_json(lab, home, cluster)["tasks"] if t["task"] == task)
    urgent = lab.run(
        ["sbatch", "-p", URGENT, "-w", node, "--exclusive", "-o", "/dev/null", "--wrap", "sleep 2", "--parsable"]
    )
    assert urgent.returncode == 0, urgent.stderr


@pytest.mark.netns
def test_an_attached_up_through_a_preemption_streams_each_allocation_and_exits_0(slurm, tmp_path, home):  # noqa: F811
    """Attached, the run's allocation preempted: `up` stays through the new allocation, shows its
    tasks' lines (resumed from their checkpoints), and exits 0 with nothing left. (A time limit
    ends an allocation the same way for `up`: when it continues a run and when not are the
    engine's tables; a real time limit is the allocation controller's test.)"""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(PREEMPTIBLE % {"task": FAKE_TASK, "steps": 30})
    up = spawn_tfctl("-f", str(cluster), "up", home=home, env=slurm.env())
    try:
        saved = wait_until(
            lambda: next(home.glob("work/*/checkpoints/worker0"), None), 120, "worker0's checkpoint", interval=0.2
        )
        assert saved is not None
        wait_until(lambda: int(saved.read_text() or 0) >= 4, 120, "worker0 at step 4", interval=0.2)
        preempt(slurm, home, cluster, "worker:0")
        out, err = up.communicate(timeout=240)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, err[-3000:]
    goes_on = re.findall(r"slurm job \d+ ended: PREEMPTED; the run goes on in allocation (\d)", err)
    assert goes_on == ["2"], err[-3000:]
    resumed = re.findall(r"^\[worker:0\]\s+worker0 resumed at step (\d+)$", out, re.M)
    assert len(resumed) == 1 and 4 <= int(resumed[0]) < 30, out[-3000:]
    # worker1's lines of the new allocation are streamed too. It is stopped once worker0, the
    # decisive task, is done: it may be a step or two behind then (CI saw 29).
    (again,) = re.findall(r"^\[worker:1\]\s+worker1 resumed at step (\d+)$", out, re.M)
    later = re.findall(r"^\[worker:1\]\s+worker1 checkpoint step (\d+)$", out.split("worker1 resumed")[1], re.M)
    assert later and int(later[-1]) > int(again) + 10, out[-3000:]
    assert "job succeeded" in err and "0 remain" in err, err[-3000:]
    run_id = json.loads(on_slurm(slurm, home, "runs", "--json").stdout)[-1]["run_id"]
    assert slurm.jobs() == [] and run_processes(slurm, run_id) == []


# -- `logs -f` across the gap: which record to follow next ------------------------------------------


@pytest.mark.parametrize(
    ("resubmits", "stored", "follows"),
    [
        (2, {"allocations": (AllocationEnd("j1", 1.0, "TIMEOUT"),), "state": RunState.RUNNING}, True),
        (2, {"state": RunState.SUCCEEDED}, False),  # the run ended with its tasks: nothing to wait for
        (0, {"allocations": (AllocationEnd("j1", 1.0, "TIMEOUT"),), "state": RunState.RUNNING}, False),
    ],
)
def test_a_follower_goes_on_into_the_next_allocation_once_its_tasks_run(tmp_path, resubmits, stored, follows):
    store = RunStore(tmp_path)
    followed = RunRecord("r", "c", "/c.yaml", 1.0, (), (), 1.0, state=RunState.RUNNING, resubmits=resubmits)
    store.create(followed)
    amend(store, "r", **stored)
    goes_on = next_allocation(store, followed, FakeClock())
    assert (goes_on is not None) == follows
    if goes_on is not None:
        assert len(goes_on.allocations) == 1
