"""Tasks in containers: the `container:` section, each runtime's command line, and with a real
podman (root only: the suite's own, `bench/containers_lab.py`) the container's life being the
task's: stopped by `stop`, gone when its monitor or every tfctl process of the host is SIGKILLed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from bench.containers_lab import IMAGE, Lab, Registry, skip_reason
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, fake, free_ports, kill_by_pid, tfctl
from tests.test_templates import check_common, copy_template, down_then_resume, run_up
from tfctl.cluster.agent import HostAgent
from tfctl.cluster.reach import container_command
from tfctl.config.loader import parse_config
from tfctl.config.model import ContainerSettings
from tfctl.errors import ConfigError, UsageError
from tfctl.runs.record import TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor import containers
from tfctl.supervisor.files import task_dir
from tfctl.supervisor.procfs import live_pids
from tfctl.supervisor.protocol import (
    ContainerLaunch,
    PruneRequest,
    ReapRequest,
    StartRequest,
    StatusRequest,
    StopRequest,
    TaskLaunch,
    TaskState,
)
from tfctl.tf.tasks import plan_tasks
from tfctl.transport.local import LocalTransport

CLUSTER = """\
name: boxed
command: "{python} train.py"
container:
  image: nvcr.io/nvidia/tensorflow:25.01-tf2-py3
  mounts: [/data:/data:ro]
  options: ["--shm-size=1g"]
jobs:
  ps: [localhost:2222]
  worker:
    hosts: [localhost:2223]
    container: {image: /srv/rootfs, runtime: podman, python: /opt/py/bin/python3}
"""


# ---------------------------------------------------------------- the cluster file


def test_the_container_section_is_read_and_a_jobs_own_wins() -> None:
    config = parse_config(CLUSTER, Path("cluster.yaml"))
    assert config.container_for("ps") == ContainerSettings(
        "nvcr.io/nvidia/tensorflow:25.01-tf2-py3", "auto", ("/data:/data:ro",), ("--shm-size=1g",)
    )
    assert config.container_for("worker") == ContainerSettings("/srv/rootfs", "podman", python="/opt/py/bin/python3")
    tasks = {t.name: t for t in plan_tasks(config, "r1", {"localhost": "/venv/bin/python"}, {"localhost": "/w"})}
    assert tasks["ps:0"].command == "python3 train.py"  # the image's python, not the host's
    assert tasks["worker:0"].command == "/opt/py/bin/python3 train.py"
    assert tasks["ps:0"].container == ContainerLaunch(
        "nvcr.io/nvidia/tensorflow:25.01-tf2-py3", "auto", ["/data:/data:ro"], ["--shm-size=1g"], "python3"
    )


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("{runtime: podman}", "container.image: missing required key `image`"),
        ("{image: x, runtime: Podman}", "did you mean `podman`?"),
        ("{image: x, mounts: [data:/data]}", "container.mounts[0]: `data:/data` is not a mount"),
        ("{image: x, options: --privileged}", "container.options: expected a list of runtime arguments"),
        ("{image: x, python: python3}", "container.python: `python3` is relative"),
        ("{image: x, gpu: 1}", "container.gpu: unknown key `gpu`"),
    ],
)
def test_a_wrong_container_section_names_the_key_and_the_fix(section: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"name: x\ncommand: run\ncontainer: {section}\njobs: {{worker: [localhost:1]}}\n", Path("c.yaml"))
    assert said in str(caught.value)
    assert "fix:" in str(caught.value)


# ---------------------------------------------------------------- command lines


def box(runtime_name: str, env: dict[str, str] | None = None, image: str = "img:1") -> list[str]:
    spec = ContainerLaunch(image, runtime_name, ["/data:/data:ro"], ["--shm-size=1g"], "/usr/bin/python3")
    c = containers.Container(
        "tfctl-r1-worker-0",
        spec,
        {"TF_CONFIG": '{"task": 1}', **(env or {})},
        "/w",
        ["/w", "/run/r1", "/state/worker-0/tether.fifo"],
        "/state/worker-0/tether.fifo",
        "/state/worker-0/output.log",
        "/state/worker-0/tether.exit",
        5.0,
        "exec python3 train.py",
        {containers.RUN_LABEL: "r1", containers.TASK_LABEL: "worker:0", containers.STORE_LABEL: "s"},
    )
    return containers.RUNTIMES[runtime_name](f"/usr/bin/{runtime_name}").run(c)


def after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_the_docker_command_line() -> None:
    argv = box("docker", {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert argv[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert "--sig-proxy=false" in argv and "--log-driver=none" in argv  # signals and output: the tether's
    assert after(argv, "--network") == ["host"]
    assert after(argv, "--user") == [f"{os.getuid()}:{os.getgid()}"]
    assert after(argv, "--volume") == [
        "/w:/w",
        "/run/r1:/run/r1",
        "/state/worker-0/tether.fifo:/state/worker-0/tether.fifo",
        f"{containers.TETHER}:{containers.TETHER}:ro",
        "/data:/data:ro",
    ]
    assert after(argv, "--gpus") == ['"device=2,3"']
    assert "CUDA_VISIBLE_DEVICES=0,1" in after(argv, "--env")  # the container numbers its GPUs from 0
    assert 'TF_CONFIG={"task": 1}' in after(argv, "--env")
    assert "--label=tfctl.task=worker:0" in argv
    image_at = argv.index("img:1")
    assert argv[image_at - 1] == "--shm-size=1g"  # options just before the image
    assert argv[image_at + 1 :] == [
        containers.TETHER,
        "/state/worker-0/tether.fifo",
        "/state/worker-0/output.log",
        "/state/worker-0/tether.exit",
        "5",
        "/bin/sh",
        "-c",
        "exec python3 train.py",
    ]
    assert after(argv, "--entrypoint") == ["/usr/bin/python3"]
    with pytest.raises(Exception, match="cannot run a rootfs folder"):
        box("docker", image="/srv/rootfs")


@pytest.mark.parametrize(
    "stderr, error",
    [
        (["docker: Error response from daemon: no such image.", "See 'docker run --help'."], None),  # docker 20.10
        (["docker: Error response from daemon: no such image.", "Run 'docker run --help' for more information"], None),
        # docker's client, at times, after a container that never started (a race of its own)
        (
            ["docker: Error response from daemon: no GPU.", "ERRO[0000] error waiting for container: context canceled"],
            None,
        ),
        (
            [
                "docker: Error response from daemon: no GPU.",
                'time="2026-11-28T10:41:58Z" level=error msg="error waiting for container: context canceled"',
            ],
            None,
        ),
        (["Error: short-name resolution enforced", ""], "Error: short-name resolution enforced"),
        ([], ""),
    ],
)
def test_the_runtimes_error_is_its_last_line_that_says_something(stderr: list[str], error: str | None) -> None:
    assert containers.last_error(stderr) == (stderr[0] if error is None else error)


def test_the_podman_command_line() -> None:
    argv = box("podman", {"CUDA_VISIBLE_DEVICES": "1"})
    assert after(argv, "--device") == ["nvidia.com/gpu=1"]
    assert ("--userns=keep-id" in argv) == (os.getuid() != 0)
    assert after(box("podman", image="/srv/rootfs"), "--rootfs") == ["/srv/rootfs"]


def test_the_apptainer_command_line() -> None:
    argv = box("apptainer", {"CUDA_VISIBLE_DEVICES": "1"})
    assert argv[:3] == ["/usr/bin/apptainer", "exec", "--pid"]  # its own PID namespace: nothing outlives it
    assert "--nv" in argv
    assert "CUDA_VISIBLE_DEVICES=1" in after(argv, "--env")  # all GPUs are there: the variable picks
    assert after(argv, "--bind")[-1] == "/data:/data:ro"
    assert after(argv, "--pwd") == ["/w"]
    assert argv[argv.index("img:1") :][:3] == ["img:1", "/usr/bin/python3", containers.TETHER]
    assert "--nv" not in box("apptainer")


@pytest.mark.parametrize("name, flag", [("podman", "--volume"), ("docker", "--volume"), ("apptainer", "--bind")])
def test_preflight_asks_the_images_python_with_the_tasks_mounts_and_options(name: str, flag: str) -> None:
    """A task's Python may come from a mount (a venv mounted in): preflight runs it so too."""
    spec = ContainerLaunch("img:1", name, ["/venv:/venv:ro"], ["--security-opt=label=disable"], "/venv/bin/python")
    argv = containers.RUNTIMES[name](f"/usr/bin/{name}").python(spec, "print(1)")
    assert after(argv, flag)[0] == "/venv:/venv:ro" and "--security-opt=label=disable" in argv
    assert argv.index("--security-opt=label=disable") < argv.index("img:1") and argv[-2:] == ["-c", "print(1)"]


@pytest.mark.parametrize("runtime_name", ["docker", "apptainer"])
def test_exec_reaches_a_container_by_its_name_and_apptainer_is_refused(runtime_name: str) -> None:
    box = ContainerLaunch("img:1", runtime_name)
    task = TaskSpec("worker", 0, "h", 2222, "run", {"A": "x y"}, "/w", container=box)
    if runtime_name == "apptainer":
        with pytest.raises(UsageError, match="apptainer container, which has no name to enter"):
            container_command("r1", task, ["ls"], tty=False)
        return
    argv = shlex.split(container_command("r1", task, ["echo", "a b"], tty=True))
    assert argv[:5] == ["exec", "docker", "exec", "--workdir", "/w"] and "--tty" in argv and "--interactive" in argv
    assert after(argv, "--env") == ["A=x y"]
    home_task = TaskSpec("worker", 0, "h", 2222, "run", {}, "~/work/my run", container=box)
    assert "exec --workdir ~/'work/my run' --interactive" in container_command("r1", home_task, ["ls"], tty=False)
    named = argv.index(containers.name_for("r1", "worker:0"))
    assert argv[named + 1 :] == ["env", "-u", "TFCTL_RUN_ID", "-u", "TFCTL_TASK", "-u", "TFCTL_STORE"] + [
        "/bin/sh",
        "-c",
        "echo 'a b'",
    ]


# ---------------------------------------------------------------- real runtimes


@pytest.fixture(params=["podman", "docker"])
def lab(request: pytest.FixtureRequest) -> Lab:
    """Each real runtime in turn."""
    found: Lab = request.getfixturevalue(f"{request.param}_lab")
    return found


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[HostAgent]:
    with HostAgent(LocalTransport(), None, str(tmp_path / "host")) as agent:
        yield agent


def run_id(request: pytest.FixtureRequest) -> str:
    return "box-" + re.sub(r"[^a-z0-9]+", "-", request.node.name)[-30:].strip("-")


TASK = "import os, sys, time; print('up', os.getuid(), os.getcwd(), os.environ['TF_CONFIG'], flush=True); "


def start_boxed(agent: HostAgent, lab: Lab, run: str, cwd: Path, source: str, grace: float = 2.0) -> dict:
    """Start worker:0 in the lab's image; its proc.json."""
    command = f"python3 -c {json.dumps(TASK + source)}"
    box = ContainerLaunch(IMAGE, lab.name)
    launch = TaskLaunch("worker:0", command, {"TF_CONFIG": '{"x": 1}'}, str(cwd), grace, "store-1", container=box)
    answer = agent.call(StartRequest(run, [launch]))
    assert answer.tasks["worker:0"].state is TaskState.RUNNING
    d = Path(task_dir(agent.root, run, "worker:0"))
    wait_until(lambda: (d / "output.log").read_text(), 30, "the task's first line", until=lambda t: "up" in t)
    return json.loads((d / "proc.json").read_text())


def conmons(run: str) -> list[int]:
    """podman's conmon processes of the run's containers (their command lines name the container)."""
    found = []
    for pid in live_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"/usr/bin/conmon") and f"tfctl-{run}-".encode() in cmdline:
            found.append(pid)
    return found


def gone(lab: Lab, run: str, timeout: float) -> float:
    """Seconds until the run has no container and no conmon left; fails after `timeout`."""
    began = time.monotonic()
    wait_until(
        lambda: (lab.containers(f"{containers.RUN_LABEL}={run}"), conmons(run)),
        timeout,
        f"the containers of {run} to go",
        until=lambda left: left == ([], []),
        interval=0.1,
    )
    return time.monotonic() - began


@pytest.fixture
def reap_after() -> Iterator[list[tuple[Lab, str]]]:
    """Runs whose containers a failing test may have left: removed by label whatever happened."""
    runs: list[tuple[Lab, str]] = []
    yield runs
    for lab, run in runs:
        for name in lab.containers(f"{containers.RUN_LABEL}={run}"):
            lab.cli("rm", "--force", name)


def test_a_task_runs_in_its_container_as_it_would_bare_and_stop_removes_it(
    agent: HostAgent, lab: Lab, tmp_path: Path, request: pytest.FixtureRequest, reap_after: list
) -> None:
    run = run_id(request)
    reap_after.append((lab, run))
    start_boxed(agent, lab, run, tmp_path, "open('made-inside', 'w').write('x'); time.sleep(300)")
    log = Path(task_dir(agent.root, run, "worker:0"), "output.log").read_text()
    assert f'up {os.getuid()} {tmp_path} {{"x": 1}}' in log  # same user, workdir and environment
    made = tmp_path / "made-inside"
    wait_until(made.exists, 10, "the task's file")
    assert (made.stat().st_uid, made.stat().st_gid) == (os.getuid(), os.getgid())
    assert lab.containers(f"{containers.RUN_LABEL}={run}") == [containers.name_for(run, "worker:0")]
    answer = agent.call(StopRequest(run, 2.0))
    assert (answer.containers, answer.containers_left) == (1, [])
    assert answer.tasks["worker:0"].state is TaskState.STOPPED
    assert answer.processes >= 2  # the task and the tether in the container, found from the host
    assert lab.containers(f"{containers.RUN_LABEL}={run}") == [] and conmons(run) == []


@pytest.mark.parametrize("victims", ["monitor", "monitor and runtime client"])
def test_a_sigkill_on_the_host_leaves_no_container(
    agent: HostAgent, lab: Lab, tmp_path: Path, request: pytest.FixtureRequest, reap_after: list, victims: str
) -> None:
    run = run_id(request)
    reap_after.append((lab, run))
    proc = start_boxed(agent, lab, run, tmp_path, "time.sleep(300)", grace=1.0)
    assert conmons(run) or lab.name == "docker"
    # The monitor, forked from the supervisor (which on localhost lives for one request), and the
    # `podman run` or `docker run` it started: every process on the host that started the task.
    kill_by_pid([proc["monitor"]["pid"], *([proc["pid"]] if victims != "monitor" else [])])
    took = gone(lab, run, 15)
    assert took < 10


def test_reap_removes_the_containers_of_runs_that_are_not_live(
    agent: HostAgent, podman_lab: Lab, tmp_path: Path, request: pytest.FixtureRequest, reap_after: list
) -> None:
    run = run_id(request)
    reap_after.append((podman_lab, run))
    start_boxed(agent, podman_lab, run, tmp_path, "time.sleep(300)")
    kept = agent.call(ReapRequest([run], 1.0, "store-1"))
    assert kept.containers == 0 and podman_lab.containers(f"{containers.RUN_LABEL}={run}")
    reaped = agent.call(ReapRequest([], 1.0, "store-1"))
    assert reaped.containers == 1 and run in reaped.runs
    gone(podman_lab, run, 10)


def test_prune_removes_the_container_an_ended_run_left_stopped(
    agent: HostAgent, lab: Lab, request: pytest.FixtureRequest, reap_after: list
) -> None:
    """What a crashed tfctl left: the run's container, stopped, never removed. `runs --prune`
    finds it by its label, says so in a dry run, and removes it."""
    run = run_id(request)
    reap_after.append((lab, run))
    name = f"tfctl-{run}-left"
    lab.cli("create", "--name", name, "--label", f"{containers.RUN_LABEL}={run}", IMAGE, "true")
    looked = agent.call(PruneRequest([run], dry_run=True))
    assert looked.containers == {run: [name]} and lab.containers(f"{containers.RUN_LABEL}={run}") == [name]
    pruned = agent.call(PruneRequest([run, "box-another-run"]))
    assert pruned.containers == {run: [name]}
    assert lab.containers(f"{containers.RUN_LABEL}={run}") == []


def test_signals_reach_the_program_in_its_container(
    agent: HostAgent, podman_lab: Lab, tmp_path: Path, request: pytest.FixtureRequest, reap_after: list
) -> None:
    run = run_id(request)
    reap_after.append((podman_lab, run))
    handler = (
        "import signal; "
        "signal.signal(signal.SIGTERM, lambda *a: (print('saving on SIGTERM', flush=True), sys.exit(0))); "
        "time.sleep(300)"
    )
    start_boxed(agent, podman_lab, run, tmp_path, handler, grace=5.0)
    began = time.monotonic()
    agent.call(StopRequest(run, 5.0))
    assert time.monotonic() - began < 4  # the program ended on SIGTERM, not at the grace period's SIGKILL
    # Once: the host signals the container's first process only, which passes it on.
    assert Path(task_dir(agent.root, run, "worker:0"), "output.log").read_text().count("saving on SIGTERM") == 1


# ---------------------------------------------------------------- tfctl up and down


def test_up_runs_a_cluster_in_containers_and_down_leaves_none(
    tmp_path: Path, home: Path, podman_lab: Lab, reap_after: list
) -> None:
    ports = free_ports(1)
    tasks_dir = FAKE_TASK.parent
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: boxed
grace_period: 2
startup_timeout: 30
container:
  image: {IMAGE}
  mounts: ["{tasks_dir}:{tasks_dir}:ro"]
jobs:
  ps:
    hosts: [localhost:{ports[0]}]
    command: "{fake(f"--name ps --port {ports[0]} --sleep -1")}"
  worker:
    hosts: [localhost, localhost]
    command: "{fake("--name w{task_index} --port -1 --lines 2 --sleep -1")}"
""")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run = up.stdout.strip()
    reap_after.append((podman_lab, run))
    assert f"in podman image {IMAGE}), no tensorflow in the image" in up.stderr  # preflight asked the image
    label = f"{containers.RUN_LABEL}={run}"
    assert sorted(podman_lab.containers(label)) == [
        containers.name_for(run, t) for t in ("ps:0", "worker:0", "worker:1")
    ]
    # Still running a while on: the workers' ports were picked (and held) by their host's
    # supervisor, whose leftover pipes once closed a monitor's FIFO, and so ended its container.
    time.sleep(1.5)
    status = json.loads(tfctl("status", "--json", "-f", str(cluster), home=home).stdout)
    assert {t["state"] for t in status["tasks"]} == {"running"}
    logs = tfctl("-f", str(cluster), "logs", "worker:1", home=home).stdout
    assert logs.startswith("[worker:1]") and "w1 started" in logs  # its output, from its container
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    assert "3 containers stopped on 1 host; 0 remain" in down.stderr
    assert podman_lab.containers(label) == [] and conmons(run) == []


def test_a_task_restarted_by_its_policy_runs_in_a_new_container_of_its_name(
    tmp_path: Path, home: Path, lab: Lab, reap_after: list
) -> None:
    """A restart in a container: the first run's container (its name the task's) is removed
    before the second starts, whose exit status is the one recorded."""
    cluster = tmp_path / "cluster.yaml"
    first, again = fake("--name w --lines 1 --exit 3"), fake("--name w --lines 1 --sleep 0.5")
    cluster.write_text(f"""name: boxed
grace_period: 2
startup_timeout: 30
workdir: {tmp_path}
container: {{image: {IMAGE}, runtime: {lab.name}, mounts: ["{FAKE_TASK.parent}:{FAKE_TASK.parent}:ro"]}}
jobs:
  worker:
    hosts: [localhost:{free_ports(1)[0]}]
    command: 'if [ -e restarted ]; then {again}; else touch restarted; {first}; fi'
    restart: {{policy: on-failure, max_restarts: 1, backoff: 0}}
""")
    up = tfctl("-f", str(cluster), "up", home=home)
    run = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    reap_after.append((lab, run))
    assert up.returncode == 0, up.stderr
    assert "worker:0 exited with code 3; restart 1 of 1" in up.stdout + up.stderr
    (task,) = json.loads(tfctl("status", "--json", "--run", run, home=home).stdout)["tasks"]
    assert task["state"] == "succeeded" and task["restarts"] == 1 and task["exit_code"] == 0
    assert (tmp_path / "restarted").exists()  # written from the first container, in the workdir
    assert lab.containers(f"{containers.RUN_LABEL}={run}") == [] and conmons(run) == []


def test_up_removes_the_containers_runs_that_are_not_active_left(
    tmp_path: Path, home: Path, podman_lab: Lab, reap_after: list
) -> None:
    """A crashed tfctl's leftovers: a container of this store's run that is not active is removed
    by the next `up`, which says so in one line; another store's (another user's) stays."""
    store = RunStore(home).store_id
    for run, its_store in (("box-crashed-run", store), ("box-their-run", "another-store")):
        reap_after.append((podman_lab, run))
        labels = [f"--label={containers.RUN_LABEL}={run}", f"--label={containers.STORE_LABEL}={its_store}"]
        podman_lab.cli("create", "--name", f"tfctl-{run}-ps-0", *labels, IMAGE, "true")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        f"name: boxed\ncommand: '{{python}} -c pass'\ncontainer: {{image: {IMAGE}}}\n"
        f"jobs: {{worker: [localhost:{free_ports(1)[0]}]}}\n"
    )
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    said = [line for line in up.stderr.splitlines() if "left by runs that are not active" in line]
    assert (
        len(said) == 1
        and "removed 1 container left by runs that are not active (box-crashed-run) on localhost" in said[0]
    )
    assert podman_lab.containers(f"{containers.RUN_LABEL}=box-crashed-run") == []
    assert podman_lab.containers(f"{containers.RUN_LABEL}=box-their-run") == ["tfctl-box-their-run-ps-0"]
    again = tfctl("-f", str(cluster), "up", home=home)
    assert again.returncode == 0 and "not active" not in again.stderr  # nothing left to remove


def test_exec_and_ssh_run_in_the_tasks_container(tmp_path: Path, home: Path, podman_lab: Lab, reap_after: list) -> None:
    """`tfctl exec` and `tfctl ssh` reach the task's own container (its first process is the
    tether), in its workdir, with its environment and without tfctl's markers."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        f"name: boxed\nworkdir: {tmp_path}\nenv: {{GREETING: 'hello there'}}\n"
        f"container: {{image: {IMAGE}, mounts: ['{FAKE_TASK.parent}:{FAKE_TASK.parent}:ro']}}\n"
        f"jobs: {{worker: {{hosts: [localhost:{free_ports(1)[0]}], command: '{fake('--port -1 --sleep -1')}'}}}}\n"
    )
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    reap_after.append((podman_lab, up.stdout.strip()))
    try:
        look = "tr '\\0' ' ' </proc/1/cmdline; echo; pwd; echo \"$GREETING ${TFCTL_RUN_ID:-unmarked}\"; "
        done = tfctl("-f", str(cluster), "exec", "worker:0", "--", "sh", "-c", look + "exit 3", home=home)
        assert done.returncode == 3, done.stderr
        first, where, said = done.stdout.splitlines()[:3]
        assert "/tether.py " in first  # the container's first process: we are in it
        assert (where, said) == (str(tmp_path), "hello there unmarked")
        shell = subprocess.run(
            [sys.executable, "-m", "tfctl", "-f", str(cluster), "ssh", "worker:0"],
            input=look + "exit 4\n",
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "TFCTL_HOME": str(home)},
        )
        assert shell.returncode == 4, shell.stderr
        assert "/tether.py " in shell.stdout and "hello there unmarked" in shell.stdout
    finally:
        tfctl("-f", str(cluster), "down", home=home)


def test_preflight_loads_an_image_tarball_once(tmp_path: Path, home: Path, lab: Lab) -> None:
    """`image: /path/image.tar` (what `podman save` or `docker save` wrote) is loaded in preflight, which says so
    and how long it took, and tagged by the tarball's path, size and time: the next run finds it."""
    tarball = tmp_path / "image.tar"
    lab.cli("save", "--output", str(tarball), IMAGE)
    port = free_ports(1)[0]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        f"name: boxed\ncommand: '{fake(f'--port {port} --sleep -1')}'\n"
        f"container: {{image: {tarball}, runtime: {lab.name}, mounts: ['{FAKE_TASK.parent}:{FAKE_TASK.parent}:ro']}}\n"
        f"jobs: {{worker: [localhost:{port}]}}\n"
    )
    first = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert first.returncode == 0, first.stderr
    assert tfctl("-f", str(cluster), "down", home=home).returncode == 0
    assert re.search(rf"localhost +loaded {re.escape(IMAGE)} from {tarball} in [0-9.]+s", first.stderr), first.stderr
    assert f"in {lab.name} image {tarball}), no tensorflow in the image" in first.stderr
    tag = containers.tarball_tag(str(tarball))
    lab.cli("image", "inspect", tag)  # raises when it is not there
    again = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert again.returncode == 0 and "loaded" not in again.stderr, again.stderr
    assert tfctl("-f", str(cluster), "down", home=home).returncode == 0


def test_preflight_pulls_a_missing_image_from_a_registry(tmp_path: Path, home: Path, podman_lab: Lab) -> None:
    """An image the host lacks is pulled (from the suite's own registry, on loopback), and `up`
    says so and how long it took."""
    reason = skip_reason("registry")
    if reason is not None:
        pytest.skip(reason)
    with Registry(tmp_path / "registry", free_ports(1)[0]) as registry:
        image = f"{registry.address}/team/train:1"
        podman_lab.cli("push", "--tls-verify=false", IMAGE, image)  # there, not here under that name
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(
            f"name: boxed\ncommand: '{{python}} -c pass'\ncontainer: {{image: '{image}', runtime: podman}}\n"
            f"jobs: {{worker: [localhost:{free_ports(1)[0]}]}}\n"
        )
        up = tfctl("-f", str(cluster), "up", home=home, env=registry.env)
    assert up.returncode == 0, up.stderr
    assert re.search(rf"localhost +pulled {re.escape(image)} in [0-9.]+s", up.stderr), up.stderr
    # podman's own lines, as it printed them: its first at once
    assert re.search(rf"localhost +image: Trying to pull {re.escape(image)}\.\.\.", up.stderr), up.stderr
    podman_lab.cli("image", "exists", image)  # raises when it is not there
    podman_lab.cli("rmi", image)


def test_a_pull_that_hangs_fails_preflight_at_its_own_timeout(tmp_path: Path, home: Path, podman_lab: Lab) -> None:
    """A registry that never answers (a loopback port nobody serves on) holds the pull, not `up`:
    `container.pull_timeout` ends it, and says which key to raise; meanwhile `up` says it waits."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        image = f"127.0.0.1:{silent.getsockname()[1]}/team/train:1"
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(
            f"name: boxed\ncommand: '{{python}} -c pass'\nstartup_timeout: 60\n"
            f"container: {{image: '{image}', runtime: podman, pull_timeout: 12}}\n"
            f"jobs: {{worker: [localhost:{free_ports(1)[0]}]}}\n"
        )
        began = time.monotonic()
        up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode != 0
    assert f"pulling image {image} took more than 12s (container.pull_timeout)" in up.stderr, up.stderr
    assert "preparing the tasks' images on localhost (10s; pulls end at container.pull_timeout)" in up.stderr
    assert re.search(rf"localhost +image: Trying to pull {re.escape(image)}\.\.\.", up.stderr), up.stderr
    assert time.monotonic() - began < 40


def test_preflight_stops_a_run_whose_image_is_missing(tmp_path: Path, home: Path, podman_lab: Lab) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "name: boxed\ncommand: '{python} -c pass'\ncontainer: {image: localhost/not-here:1}\n"
        f"jobs: {{worker: [localhost:{free_ports(1)[0]}]}}\n"
    )
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode != 0
    assert "image localhost/not-here:1 is not on this host, and pulling it failed: " in up.stderr


def test_top_sees_what_the_containers_processes_use(
    agent: HostAgent, podman_lab: Lab, tmp_path: Path, request: pytest.FixtureRequest, reap_after: list
) -> None:
    run = run_id(request)
    reap_after.append((podman_lab, run))
    start_boxed(agent, podman_lab, run, tmp_path, "x = bytearray(64 << 20); exec('while True: pass')")
    usage = wait_until(
        lambda: agent.call(StatusRequest(run, {"worker:0": 0})).tasks["worker:0"].usage,
        15,
        "a usage sample of the busy task",
        until=lambda u: u is not None and u.cpu_percent > 30,
    )
    assert usage is not None and usage.rss_bytes > 64 << 20  # the task's memory, not the runtime client's
    agent.call(StopRequest(run, 1.0))


# ---------------------------------------------------------------- real TensorFlow in containers


def tf_in_image_skip() -> str | None:
    """Why the suite's TensorFlow cannot run in the test image, or None. The image has Debian 12's
    Python and no TensorFlow: the suite's virtualenv, mounted in at its own path, brings it, so
    the suite's Python must be that very interpreter (a venv made from /usr/bin/python3, as CI's)."""
    if importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed"
    real = os.path.realpath(sys.executable)
    if real != "/usr/bin/python3.11" or sys.prefix == sys.base_prefix:
        return f"the suite's Python ({real}) is not a venv of the image's /usr/bin/python3.11"
    return None


def boxed_tf() -> str:
    """The cluster file's `container:` for the template in the test image, TensorFlow from the venv."""
    reason = tf_in_image_skip()
    if reason is not None:
        pytest.skip(reason)
    venv = sys.prefix
    return f"container:\n  image: {IMAGE}\n  python: {venv}/bin/python\n  mounts: ['{venv}:{venv}:ro']\n"


@pytest.mark.parametrize("template, chief", [("parameter-server", "chief:0"), ("multi-worker-mirrored", "worker:0")])
def test_a_template_trains_in_containers_to_its_accuracy(
    template: str, chief: str, tmp_path: Path, home: Path, podman_lab: Lab
) -> None:
    cluster = copy_template(template, tmp_path, train_steps=200, extra=boxed_tf())
    up = run_up(cluster, home)
    check_common(up, chief, 200)
    assert f"in podman image {IMAGE}), tensorflow " in up.stderr  # preflight asked the image's Python
    run = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert podman_lab.containers(f"{containers.RUN_LABEL}={run}") == [] and conmons(run) == []


def test_the_parameter_server_template_saves_on_down_in_containers_and_resumes(
    tmp_path: Path, home: Path, podman_lab: Lab
) -> None:
    """`down` reaches the chief in its container as it would bare: it saves at the step it
    stopped at, and `up --resume` goes on from there."""
    states = down_then_resume(
        tmp_path,
        home,
        "parameter-server",
        "chief:0",
        "chief: SIGTERM: saved a checkpoint at global step",
        extra=boxed_tf(),
    )
    assert states["chief:0"]["exit_code"] == 143
    for run in json.loads(tfctl("runs", "--json", home=home).stdout):
        assert podman_lab.containers(f"{containers.RUN_LABEL}={run['run_id']}") == []
