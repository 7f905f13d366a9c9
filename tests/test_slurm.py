"""`backend: slurm`: decisions with a fake Slurm, then whole runs on a real one (`bench/slurm_lab.py`)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from bench.netns_hosts import require_netns
from bench.slurm_lab import SlurmLab, missing_binaries
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, REPO, marked_processes, no_warnings, tfctl
from tests.test_reach import fetch, start_tensorboard, tensorboard_python
from tfctl.backends.slurm.allocation import SlurmError, sbatch_argv, submit, wait_running
from tfctl.backends.slurm.placement import nodes_by_job, place, step_options
from tfctl.backends.slurm.sacct import slurm_accounting
from tfctl.config.loader import parse_config
from tfctl.engine.clock import FakeClock
from tfctl.runs.accounting import scheduler_text

SLURM_FILE = """\
name: fake
backend: slurm
slurm: {partition: debug, time: "00:10:00", controller: login}
command: "{python} %(task)s --name {job_name}{task_index} --port -1 --lines 5 --sleep %(sleep)s"
grace_period: 2
jobs:
  ps: {count: 1, port: 2222, command: "{python} %(task)s --name ps --port -1 --sleep -1"}
  worker: {count: 2, port: 2222}
"""


def fake_file(sleep: float = 0) -> str:
    return SLURM_FILE % {"task": FAKE_TASK, "sleep": sleep}


# A ps on partition `cpu`, two workers sharing one node of partition `gpu`, a stand-in GPU each.
HET_FILE = """\
name: het
backend: slurm
slurm: {time: "00:10:00", controller: login}
command: "{python} %(task)s --name {job_name}{task_index} --port -1 --devices --sleep 1"
grace_period: 2
jobs:
  ps: {count: 1, port: 2222, command: "{python} %(task)s --name ps --port -1 --sleep -1", slurm: {partition: cpu}}
  worker: {count: 2, port: 2222, gpus: 1, slurm: {partition: gpu, nodes: 1, mem: 100M}}
""" % {"task": FAKE_TASK}


# -- decisions, without a Slurm ----------------------------------------------------------------


def test_sbatch_asks_for_one_node_per_task_unless_told():
    config = parse_config(fake_file(), Path("c.yaml"))
    argv = sbatch_argv(config, "tfctl-run")
    assert "--nodes=3" in argv and "--ntasks=3" in argv
    assert "--partition=debug" in argv and "--time=00:10:00" in argv
    text = fake_file().replace("partition: debug,", "nodes: 2, extra: [--exclusive],")
    text = text.replace("worker: {count: 2, port: 2222}", "worker: {count: 2, port: 2222, gpus: 2, cpus: 2}")
    capped = parse_config(text, Path("c.yaml"))
    argv = sbatch_argv(capped, "tfctl-run")
    assert "--nodes=2" in argv and "--gpus=4" in argv and "--cpus-per-task=2" in argv and argv[-1] == "--exclusive"


def test_each_task_step_asks_slurm_for_its_own_gpus_and_cores():
    text = fake_file().replace("worker: {count: 2, port: 2222}", "worker: {count: 2, port: 2222, gpus: 2, cpus: 4}")
    config = parse_config(text, Path("c.yaml"))
    assert step_options(config) == {
        "ps:0": ["--overlap"],
        "worker:0": ["--gpus=2", "--exact", "--cpus-per-task=4"],
        "worker:1": ["--gpus=2", "--exact", "--cpus-per-task=4"],
    }


def test_jobs_that_ask_for_different_nodes_make_one_heterogeneous_job():
    config = parse_config(HET_FILE, Path("c.yaml"))
    argv = sbatch_argv(config, "tfctl-run")
    split = argv.index(":")
    ps, workers = argv[:split], argv[split + 1 :]
    assert "--partition=cpu" in ps and "--nodes=1" in ps and "--ntasks=1" in ps and "--time=00:10:00" in ps
    assert "--gpus" not in " ".join(ps)
    assert all(a in workers for a in ("--partition=gpu", "--nodes=1", "--ntasks=2", "--gpus=2", "--mem=100M"))
    assert step_options(config) == {
        "ps:0": ["--het-group=0", "--overlap"],
        "worker:0": ["--het-group=1", "--gpus=1", "--exact"],
        "worker:1": ["--het-group=1", "--gpus=1", "--exact"],
    }
    placed = place(config, nodes_by_job(config, [("c1",), ("g1", "g2")]))
    assert [str(a) for job in placed.jobs.values() for a in job.addresses] == ["c1:2222", "g1:2222", "g2:2222"]


def test_jobs_alike_stay_one_allocation():
    text = fake_file().replace(
        "worker: {count: 2, port: 2222}", "worker: {count: 2, port: 2222, slurm: {partition: debug}}"
    )
    argv = sbatch_argv(parse_config(text, Path("c.yaml")), "tfctl-run")
    assert ":" not in argv and "--nodes=3" in argv and "--partition=debug" in argv


def test_dry_run_shows_the_components(home, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(HET_FILE)
    shown = tfctl("-f", str(cluster), "up", "--dry-run", home=home)
    assert shown.returncode == 0, shown.stderr
    assert "one heterogeneous job of 2 components" in shown.stderr
    assert "component 0: ps on partition cpu, 1 node: node1" in shown.stderr
    assert "component 1: worker on partition gpu, mem 100M, 1 node, 2 GPUs: node2" in shown.stderr
    assert "worker:1  node2:2223" in shown.stdout


@pytest.mark.parametrize(
    ("job", "error"),
    [
        ("slurm: {partitoin: gpu}", "jobs.worker.slurm.partitoin: unknown key `partitoin`"),
        ("slurm: {mem: 12X}", "jobs.worker.slurm.mem: is not a Slurm memory size: '12X'"),
        ("slurm: {nodes: 0}", "jobs.worker.slurm.nodes: must be a whole number of nodes, 1 or more"),
        ("slurm: gpu", "jobs.worker.slurm: expected a mapping"),
    ],
)
def test_a_jobs_own_slurm_keys_are_checked(home, tmp_path, job, error):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(fake_file().replace("worker: {count: 2, port: 2222}", f"worker: {{count: 2, {job}}}"))
    shown = tfctl("-f", str(cluster), "up", "--dry-run", home=home)
    assert shown.returncode == 2 and error in shown.stderr and "fix:" in shown.stderr


def test_a_jobs_slurm_keys_need_the_slurm_backend(home, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: x\ncommand: run\njobs:\n  worker: {hosts: [localhost], slurm: {partition: gpu}}\n")
    shown = tfctl("-f", str(cluster), "up", "--dry-run", home=home)
    assert shown.returncode == 2 and "jobs.worker.slurm: is for `backend: slurm`" in shown.stderr


SACCT = """\
5+0|COMPLETED|62|120|billing=2,cpu=2,mem=1000M,node=1
5+1|COMPLETED|60|240|billing=4,cpu=4,gres/gpu=2,mem=2000M,node=1
4|TIMEOUT|3600|7200|billing=2,cpu=2,gres/gpu=1,node=1
"""


def test_slurms_accounting_is_summed_per_allocation_in_the_runs_order():
    run, calls = fake_slurm({"sacct": [SACCT]})
    figures = slurm_accounting(["4", "5", "6"], run)
    assert calls[0][:4] == ["sacct", "--parsable2", "--noheader", "--allocations"] and "--jobs=4,5,6" in calls[0]
    assert figures["allocations"] == [
        {"id": "4", "state": "TIMEOUT", "elapsed_seconds": 3600.0, "cpu_hours": 2.0, "gpu_hours": 1.0},
        {"id": "5", "state": "COMPLETED", "elapsed_seconds": 62.0, "cpu_hours": 0.1, "gpu_hours": 0.0333},
    ]
    assert figures["total"] == {"elapsed_seconds": 3662.0, "cpu_hours": 2.1, "gpu_hours": 1.0333}
    assert figures["missing"] == ["6"]
    assert scheduler_text(figures) == (
        "job 4 TIMEOUT: 1.00 h, CPU 2.00 h, GPU 1.00 h; job 5 COMPLETED: 1.0 min, CPU 6.0 min, GPU 2.0 min; "
        "job 6: not recorded yet"
    )


def test_without_accounting_slurm_says_so_and_tfctls_figures_stand():
    run, _ = fake_slurm({"sacct": ["!Slurm accounting storage is disabled"]})
    figures = slurm_accounting(["4"], run)
    assert figures == {"source": "sacct", "enabled": False, "why": "Slurm accounting storage is disabled"}
    assert scheduler_text(figures) == "off (Slurm accounting storage is disabled): tfctl's figures only"


def test_placement_spreads_the_ps_and_gives_tasks_sharing_a_node_their_own_ports():
    text = fake_file().replace("ps: {count: 1,", "ps: {count: 2,").replace("worker: {count: 2,", "worker: {count: 3,")
    placed = place(parse_config(text, Path("c.yaml")), ("n1", "n2"))
    assert [str(a) for a in placed.jobs["ps"].addresses] == ["n1:2222", "n2:2222"]
    assert [str(a) for a in placed.jobs["worker"].addresses] == ["n1:2223", "n2:2223", "n1:2224"]


def test_placement_leaves_the_ports_of_a_job_without_port_to_each_node():
    text = fake_file().replace("worker: {count: 2, port: 2222}", "worker: {count: 3}")
    placed = place(parse_config(text, Path("c.yaml")), ("n1", "n2"))
    assert [str(a) for a in placed.jobs["ps"].addresses] == ["n1:2222"]
    assert [str(a) for a in placed.jobs["worker"].addresses] == [
        "n2:<chosen at start>",
        "n1:<chosen at start>",
        "n2:<chosen at start>",
    ]
    assert placed.ports_to_choose() == {"n1": 1, "n2": 2} and placed.ports_written("n1") == [2222]


def fake_slurm(answers: dict[str, list[str]]):
    """A runner answering each command (by its first word) from a script of outputs."""
    calls = []

    def run(argv, stdin):
        calls.append(argv)
        outputs = answers[argv[0]]
        out = outputs.pop(0) if len(outputs) > 1 else outputs[0]
        code = 1 if out.startswith("!") else 0
        return subprocess.CompletedProcess(argv, code, "" if code else out, out[1:] if code else "")

    return run, calls


def test_waiting_says_why_slurm_keeps_the_job_pending_and_returns_its_nodes():
    run, _ = fake_slurm(
        {
            "squeue": ["5|PENDING|Priority|", "5|PENDING|Priority|", "5|PENDING|Resources|", "5|RUNNING|None|n[1-2]"],
            "scontrol": ["n1\nn2"],
        }
    )
    said = []
    nodes = wait_running("5", lambda who, what: said.append(what), run, FakeClock()).nodes
    assert nodes == ("n1", "n2")
    assert said == [
        "job 5 pending: waiting for resources: Priority (other jobs come first)",
        "job 5 pending: waiting for resources (nodes are busy)",
    ]


def test_a_refused_allocation_is_an_error_in_slurms_words():
    run, _ = fake_slurm({"sbatch": ["!sbatch: error: invalid partition specified: gpu"]})
    config = parse_config(fake_file(), Path("c.yaml"))
    with pytest.raises(SlurmError) as caught:
        submit(config, "x", run)
    assert "Slurm refused the allocation: invalid partition specified: gpu" in caught.value.message


def test_a_job_that_ends_while_queued_is_reported():
    run, _ = fake_slurm({"squeue": [""], "scontrol": ["JobId=7 JobState=CANCELLED Reason=None"]})
    with pytest.raises(SlurmError) as caught:
        wait_running("7", lambda *_: None, run, FakeClock())
    assert "ended before it started: CANCELLED" in caught.value.message


# -- whole runs on a real Slurm ------------------------------------------------------------------


# Each module that uses the lab has its own (names, addresses, ports), so `pytest -n` runs them side by side.
LAB_NAMES = {
    "tests.test_slurm": ("tfctl-sm", "tfctlbr57", "10.77.57"),
    "tests.test_resubmit": ("tfctl-sr", "tfctlbr55", "10.77.55"),
    "tests.test_slurm_controller": ("tfctl-sk", "tfctlbr56", "10.77.56"),
    "tests.test_slurm_containers": ("tfctl-sz", "tfctlbr58", "10.77.58"),
}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, request):
    require_netns()
    missing = missing_binaries()
    if missing:
        if os.environ.get("TFCTL_REQUIRE_NETNS", "") not in ("", "0"):
            pytest.fail(f"Slurm is required here but missing: {', '.join(missing)}", pytrace=False)
        pytest.skip(f"Slurm is not installed (apt install slurm-wlm munge): missing {', '.join(missing)}")
    if request.module.__name__ not in LAB_NAMES:
        pytest.fail(f"{request.module.__name__} uses the Slurm lab: give it its own names in LAB_NAMES")
    prefix, bridge, subnet = LAB_NAMES[request.module.__name__]
    with SlurmLab(tmp_path_factory.mktemp("slurm"), prefix=prefix, bridge=bridge, subnet=subnet) as lab:
        yield lab


def on_slurm(slurm: SlurmLab, home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return tfctl(*args, home=home, timeout=timeout, env=slurm.env())


def start_detached(
    slurm: SlurmLab, tmp_path: Path, home: Path, sleep: float
) -> tuple[Path, subprocess.CompletedProcess]:
    """`up -d` of the stand-in cluster, whose workers run `sleep` seconds; its file and the result."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(fake_file(sleep=sleep))
    up = on_slurm(slurm, home, "-f", str(cluster), "up", "-d")
    assert up.returncode == 0, up.stderr
    return cluster, up


def run_processes(slurm: SlurmLab, run_id: str) -> list[int]:
    """Processes of the run on any node (every task and monitor carries TFCTL_RUN_ID)."""
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


@pytest.mark.netns
def test_detached_run_status_logs_and_down_leave_no_job_step_or_process(slurm, tmp_path, home):
    cluster, up = start_detached(slurm, tmp_path, home, sleep=60)
    run_id = up.stdout.strip()
    assert "running on tfh0, tfh1, tfh2" in up.stderr
    assert f"the run's controller runs here, on {socket.gethostname()} (`controller: login`)" in up.stderr
    no_warnings(up.stderr)
    (job,) = slurm.jobs()
    steps = slurm.steps()
    assert len([s for s in steps if s.startswith(f"{job}.") and s != f"{job}.batch"]) >= 3  # a step per task
    shown = json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)
    slurm_part = shown["run"]["slurm"]
    assert slurm_part == {**slurm_part, "job_id": job, "owned": True, "state": "RUNNING", "reason": ""}
    # The lab keeps no accounting: Slurm says so, and tfctl's own figures stand.
    assert slurm_part["accounting"] == {
        "source": "sacct",
        "enabled": False,
        "why": "Slurm accounting storage is disabled",
    }
    assert shown["run"]["accounting"]["total"]["wall_seconds"] > 0
    hosts = {t["task"]: f"{t['host']}:{t['port']}" for t in shown["tasks"]}
    assert hosts == {"ps:0": "tfh0:2222", "worker:0": "tfh1:2222", "worker:1": "tfh2:2222"}
    assert all(t["state"] == "running" and t["listening"] for t in shown["tasks"])
    logs = on_slurm(slurm, home, "-f", str(cluster), "logs")
    assert "[worker:1] worker1 line 4" in logs.stdout
    assert run_processes(slurm, run_id)
    down = on_slurm(slurm, home, "-f", str(cluster), "down")
    assert down.returncode == 0, down.stderr
    assert f"slurm job {job}: CANCELLED" in down.stderr and "0 remain" in down.stderr
    assert slurm.jobs() == [] and slurm.steps() == []
    assert run_processes(slurm, run_id) == []
    # The nodes kept their task state under the shared home; pruning reaches it from here.
    states = list(home.glob(f"hosts/*/tasks/{run_id}"))
    assert len(states) == 3
    pruned = on_slurm(slurm, home, "runs", "--prune", "--keep", "0", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert [r["removed"] for r in json.loads(pruned.stdout)["runs"]] == [True]
    assert not any(p.exists() for p in states) and not (home / "work" / run_id).exists()


@pytest.mark.netns
def test_attached_run_succeeds_and_releases_its_allocation(slurm, tmp_path, home):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(fake_file(sleep=1))
    up = on_slurm(slurm, home, "-f", str(cluster), "up")
    assert up.returncode == 0, up.stderr
    assert "job succeeded: worker:0 finished successfully" in up.stderr
    no_warnings(up.stderr)
    assert "[worker:0] worker0 line 4" in up.stdout
    assert slurm.jobs() == []
    run_id = json.loads(on_slurm(slurm, home, "runs", "--json").stdout)[-1]["run_id"]
    assert run_processes(slurm, run_id) == []


@pytest.mark.netns
def test_slurm_ending_the_job_fails_the_run_with_slurms_reason(slurm, tmp_path, home):
    cluster, up = start_detached(slurm, tmp_path, home, sleep=300)
    run_id = up.stdout.strip()
    (job,) = slurm.jobs()
    slurm.run(["scancel", job])
    run = wait_until(
        lambda: json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)["run"],
        30,
        "the run's end",
        until=lambda run: run["state"] != "running",
        interval=0.5,
    )
    assert run["state"] == "failed"
    assert run["reason"] == f"Slurm ended job {job}: CANCELLED"
    assert slurm.jobs() == []
    wait_until(lambda: run_processes(slurm, run_id) == [], 10, "no process of the run left", interval=0.2)


@pytest.mark.netns
def test_inside_an_allocation_the_run_uses_it_and_leaves_it_to_its_owner(slurm, tmp_path, home):
    holder = slurm.run(
        ["sbatch", "--parsable", "--nodes=3", "--ntasks=3", "--output=/dev/null"],
        input="#!/bin/sh\nexec sleep 600\n",
    )
    job = holder.stdout.strip()
    try:
        holder_state = ["squeue", "-h", "-j", job, "-o", "%T"]
        wait_until(
            lambda: slurm.run(holder_state).stdout.strip() == "RUNNING", 20, "the holder job running", interval=0.2
        )
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(fake_file(sleep=0))
        up = tfctl("-f", str(cluster), "up", home=home, timeout=120, env={**slurm.env(), "SLURM_JOB_ID": job})
        assert up.returncode == 0, up.stderr
        assert f"inside allocation {job} (SLURM_JOB_ID)" in up.stderr
        assert slurm.jobs() == [job]  # still there: not tfctl's to end
    finally:
        slurm.run(["scancel", job])


STAND_IN_SACCT = """#!/bin/sh
# sacct of a cluster that keeps accounting: one line per component of the job asked for.
for word in "$@"; do case "$word" in --jobs=*) job="${word#--jobs=}";; esac; done
echo "$job+0|COMPLETED|30|60|billing=2,cpu=2,node=1"
echo "$job+1|COMPLETED|30|120|billing=2,cpu=2,gres/gpu=2,node=1"
"""


@pytest.mark.netns
@pytest.mark.parametrize("controller", ["login", "allocation"])
def test_a_heterogeneous_job_puts_each_task_where_its_job_asked(slurm, tmp_path, home, controller):
    """... with the run's controller here or in the batch script; and, with a stand-in `sacct`
    (the lab keeps no accounting), keeps Slurm's figures."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        HET_FILE.replace(
            'slurm: {time: "00:10:00", controller: login}', f'slurm: {{time: "00:10:00", controller: {controller}}}'
        )
    )
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    (stand_ins / "sacct").write_text(STAND_IN_SACCT)
    (stand_ins / "sacct").chmod(0o755)
    path = {**slurm.env(), "PATH": f"{stand_ins}:{os.environ['PATH']}"}
    up = tfctl("-f", str(cluster), "up", home=home, timeout=120, env=path)
    assert up.returncode == 0, up.stderr
    assert "component 0: tfh0; component 1: tfh1" in up.stderr
    assert "job succeeded: worker:0 finished successfully" in up.stderr
    no_warnings(up.stderr)
    assert 'tf_config={"cluster":{"ps":["tfh0:2222"],"worker":["tfh1:2222","tfh1:2223"]}' in up.stdout
    devices = {
        line.split("]")[0].strip("["): json.loads(line.split(" devices ", 1)[1])["cuda"]
        for line in up.stdout.splitlines()
        if " devices " in line
    }
    assert sorted(devices) == ["worker:0", "worker:1"] and sorted(devices.values()) == ["0", "1"]
    assert slurm.jobs() == []
    run = json.loads(on_slurm(slurm, home, "runs", "--json").stdout)[-1]
    assert run_processes(slurm, run["run_id"]) == []
    (allocation,) = run["accounting"]["slurm"]["allocations"]
    assert allocation["state"] == "COMPLETED" and allocation["cpu_hours"] == 0.05 and allocation["gpu_hours"] == 0.0167
    assert run["accounting"]["total"]["wall_seconds"] > 0  # tfctl's own, beside
    report = tfctl(
        "-f", str(cluster), "report", "--run", run["run_id"], "-o", str(tmp_path / "r.html"), home=home, env=path
    )
    assert report.returncode == 0, report.stderr
    assert f"job {allocation['id']} COMPLETED: 30 s, CPU 3.0 min, GPU 1.0 min" in (tmp_path / "r.html").read_text()


@pytest.mark.netns
def test_tensorboard_is_served_from_a_node_through_the_allocation(slurm, tmp_path, home):
    tensorboard_python()  # this interpreter, which the nodes share, has it
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(fake_file(sleep=300).replace("grace_period: 2\n", "grace_period: 2\nlogdir: logs/{run_id}\n"))
    assert on_slurm(slurm, home, "-f", str(cluster), "up", "-d").returncode == 0
    board = start_tensorboard(["-f", str(cluster), "tensorboard"], home, env=slurm.env())
    try:
        url = board.url(timeout=120)
        assert fetch(url) == 200 and fetch(url) == 200  # each connection a relaying step of its own
        board.proc.send_signal(signal.SIGINT)
        rest = board.finish(timeout=30)
    finally:
        board.kill()
    assert "TensorBoard for run fake-" in rest and "on tfh1 (the host of worker:0" in rest
    assert re.search(r"Ctrl-C: TensorBoard stopped on tfh1 \(\d processes; 0 remain; its port is closed\)", rest), rest
    down = on_slurm(slurm, home, "-f", str(cluster), "down")
    assert down.returncode == 0, down.stderr
    assert slurm.jobs() == [] and slurm.steps() == []


tf_needed = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")


@pytest.mark.tf
@pytest.mark.netns
@tf_needed
def test_mnist_trains_on_three_slurm_nodes(slurm, tmp_path, home):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: mnist-slurm
backend: slurm
workdir: {REPO / "examples" / "mnist"}
command: >-
  {{python}} train.py --job_name={{job_name}} --task_index={{task_index}}
  --ps_hosts={{ps_hosts}} --worker_hosts={{worker_hosts}} --train_steps 3000
grace_period: 5
jobs:
  ps: {{count: 1, port: 2222}}
  worker: {{count: 2, port: 2222}}
""")
    up = on_slurm(slurm, home, "-f", str(cluster), "up", timeout=300)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    assert "job succeeded: worker:0 finished successfully" in up.stderr
    assert "the run's controller runs in it" in up.stderr  # the default: in the allocation, not here
    no_warnings(up.stderr)
    accuracy = float(up.stdout.split("final test accuracy ")[1].split()[0])
    assert accuracy > 0.8
    assert "[ps:0]" in up.stdout and "Started server with target: grpc://tfh0:2222" in up.stdout
    assert slurm.jobs() == []
    run_id = json.loads(on_slurm(slurm, home, "runs", "--json").stdout)[-1]["run_id"]
    assert run_processes(slurm, run_id) == []
