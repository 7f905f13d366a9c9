"""`container:` on a Slurm with pyxis (`srun --container-image`): pyxis is in neither Debian nor
PyPI, so its command lines are checked here, not run: the decision and each step's argv through
the fake Slurm runner, and a whole run on stand-ins for Slurm's commands whose srun logs pyxis's
flags and runs each step on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAKE_TASK, tfctl
from tests.test_slurm import fake_file, fake_slurm
from tfctl.backends.base import Acquired
from tfctl.backends.slurm.allocation import SlurmError
from tfctl.backends.slurm.backend import SlurmAllocation, SlurmBackend, StepLauncher
from tfctl.backends.slurm.placement import node_count, place, settings_of
from tfctl.backends.slurm.pyxis import Choice, choose, enroot_uri, first_look, import_images, node_container
from tfctl.backends.slurm.transport import SlurmStepSpec, SlurmTransport
from tfctl.cluster.agent import HostAgent
from tfctl.config.loader import parse_config
from tfctl.config.model import ClusterConfig, ContainerSettings
from tfctl.controller.start.plan import Plan, draft, make_plan
from tfctl.errors import ConfigError, UsageError

BOXED = """\
name: boxed
backend: slurm
slurm: {time: "00:10:00", controller: login%(slurm)s}
command: "{python} train.py --job_name={job_name}"
container:
  image: %(image)s
  mounts: ["/data:/data:ro"]
jobs:
  ps: {count: 1, port: 2222}
  worker: {count: 2, port: 2222, gpus: 1}
"""
IMAGE = "nvcr.io/nvidia/tensorflow:25.01-tf2-py3"
PYXIS_HELP = """Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]
      --overlap               Allow other steps to overlap this step
      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH
                              [pyxis] the image to use for the container
"""
PLAIN_HELP = "Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]\n      --overlap   Allow other steps\n"


def boxed(image: str = IMAGE, slurm: str = "", worker: str = ""):
    text = BOXED % {"image": image, "slurm": slurm}
    if worker:
        text = text.replace("worker: {count: 2, port: 2222, gpus: 1}", f"worker: {{count: 2, port: 2222, {worker}}}")
    return parse_config(text, Path("/srv/proj/cluster.yaml"))


@pytest.mark.parametrize(
    ("image", "uri"),
    [
        ("nvcr.io/nvidia/tensorflow:25.01-tf2-py3", "nvcr.io#nvidia/tensorflow:25.01-tf2-py3"),
        ("localhost:5000/team/train:1", "localhost:5000#team/train:1"),
        ("localhost/train:1", "localhost#train:1"),
        ("tensorflow/tensorflow:2.16.1", "tensorflow/tensorflow:2.16.1"),  # Docker Hub: as written
        ("ubuntu", "ubuntu"),
        ("/shared/images/train.sqsh", "/shared/images/train.sqsh"),
        ("nvcr.io#nvidia/tensorflow:1", "nvcr.io#nvidia/tensorflow:1"),  # already enroot's
    ],
)
def test_an_image_is_named_as_enroot_takes_it(image, uri):
    assert enroot_uri(image) == uri


def test_a_nodes_container_mounts_tfctls_folders_and_the_users_with_pyxis_flags():
    box = ContainerSettings(
        IMAGE, mounts=("/data:/data:ro,rslave", "/scratch:/scratch"), options=("--container-writable",)
    )
    node = node_container("boxed-1", box, "/home/u/.tfctl", "/srv/proj")
    assert node.python == "python3"
    assert node.options == [
        "--container-image=nvcr.io#nvidia/tensorflow:25.01-tf2-py3",
        "--container-name=tfctl-boxed-1",
        "--container-mounts=/home/u/.tfctl:/home/u/.tfctl,/srv/proj:/srv/proj,"
        "/etc/machine-id:/etc/machine-id:ro+nofail,/var/lib/dbus/machine-id:/var/lib/dbus/machine-id:ro+nofail,"
        "/data:/data:ro+rslave,/scratch:/scratch",
        "--container-workdir=/srv/proj",
        "--no-container-remap-root",
        "--no-container-entrypoint",
        "--container-writable",
    ]
    own = node_container("r", ContainerSettings("/x.sqsh", python="/opt/venv/bin/python"), "/w", "/w")
    assert own.python == "/opt/venv/bin/python" and "--container-mounts=/w:/w,/etc" in " ".join(own.options)


@pytest.mark.parametrize(
    ("config", "help_text", "why"),
    [
        (boxed(), PYXIS_HELP, ""),
        (boxed(image="/shared/train.sqsh"), PYXIS_HELP, ""),
        (boxed(worker='container: {image: x, mounts: ["/d:/d:ro,rslave"]}', slurm=", nodes: 3"), PYXIS_HELP, ""),
        (
            boxed(worker='container: {image: x, mounts: ["/a,b:/a,b"]}'),
            PYXIS_HELP,
            "`jobs.worker.container.mounts` has a path with a comma",
        ),
        (boxed(), PLAIN_HELP, "this Slurm's srun has no --container-image (pyxis is not installed)"),
        (boxed(image="/srv/rootfs"), PYXIS_HELP, "`container.image` is a rootfs folder (/srv/rootfs)"),
        (boxed(image="/srv/train.tar"), PYXIS_HELP, "`container.image` is an image tarball (/srv/train.tar)"),
        (
            boxed(worker="container: {image: x, runtime: podman}"),
            PYXIS_HELP,
            "`jobs.worker.container.runtime` asks for podman",
        ),
        (
            boxed(slurm=", nodes: 1", worker="container: {image: other:1}"),
            PYXIS_HELP,
            "jobs ps and worker share node n1 in different containers",
        ),
    ],
)
def test_auto_takes_pyxis_only_where_srun_has_it_and_it_can_hold_every_container(config, help_text, why):
    run, calls = fake_slurm({"srun": [help_text]})
    choice = chosen(config, "auto", run)
    assert calls == [["srun", "--help"]]
    assert why in choice.why and bool(choice.why) == bool(why)
    assert sorted(choice.nodes) == ([] if why else sorted({a.host for _, _, a in on_nodes(config).tasks()}))
    with pytest.raises(UsageError) if why else contextlib.nullcontext():
        chosen(config, "pyxis", run)


def test_pyxis_asked_for_where_it_cannot_be_names_the_key_and_the_fix_before_slurm_is_asked(monkeypatch):
    calls: list[list[str]] = []
    with pytest.raises(UsageError) as caught:
        allocated(boxed(image="/srv/train.tar", slurm=", containers: pyxis"), PYXIS_HELP, monkeypatch, calls=calls)
    assert caught.value.message.startswith("slurm.containers is pyxis, but `container.image` is an image tarball")
    assert "squashfs" in (caught.value.hint or "") and "slurm.containers: runtime" in (caught.value.hint or "")
    assert calls == [["srun", "--help"]]  # no allocation asked for, none to wait for


def test_srun_is_not_asked_without_containers_or_with_the_runtime_chosen():
    run, calls = fake_slurm({"srun": [PYXIS_HELP]})
    bare = parse_config(fake_file(), Path("c.yaml"))
    assert chosen(bare, "auto", run) == Choice({})
    assert chosen(boxed(slurm=", containers: runtime"), "runtime", run) == Choice({})
    assert calls == []


def chosen(config: ClusterConfig, way: str, run) -> Choice:
    """What `acquire` decides: before the allocation, then on its nodes."""
    return choose(on_nodes(config), way, first_look(config, way, run))


def on_nodes(config: ClusterConfig) -> ClusterConfig:
    """The cluster placed as on an allocation of nodes n1, n2..."""
    return place(config, tuple(f"n{i}" for i in range(1, node_count(config) + 1)))


# -- a run's steps, from the allocation through a fake Slurm ---------------------------------


def allocated(
    config: ClusterConfig,
    help_text: str,
    monkeypatch: pytest.MonkeyPatch,
    failed: dict[str, str] | None = None,
    calls: list[list[str]] | None = None,
):
    """`acquire` of job 5 on nodes n1..n3 through a fake Slurm whose `srun --help` says
    `help_text`, and whose image imports fail as `failed` says: what it got, the steps that
    imported the image, and what it said; Slurm's calls into `calls`."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run, made = fake_slurm(
        {
            "sbatch": ["5"],
            "squeue": ["5|RUNNING|None|n[1-3]", ""],
            "scontrol": ["n1\nn2\nn3", "JobId=5 JobState=CANCELLED Reason=None"],
            "srun": [help_text],
            "scancel": [""],
        }
    )
    imports: list[tuple[dict[str, list[str]], float]] = []

    def import_images(argvs, timeout, waiting):
        imports.append((dict(argvs), timeout))
        waiting(10.0)
        return failed or {}

    said: list[str] = []
    try:
        acquired = SlurmBackend(run, import_images).acquire(config, "boxed-1", lambda _who, what: said.append(what))
    finally:
        (calls if calls is not None else []).extend(made)
    return acquired, imports, said


def steps_of(acquired: Acquired) -> tuple[dict[str, list[str]], Plan]:
    """Each task's step as the backend starts it, and its plan (the TaskLaunch its monitor gets)."""
    run = draft(acquired.config, "boxed-1", acquired.state)
    plan = make_plan(run)
    launcher = StepLauncher(SlurmAllocation.from_wire(acquired.state or {}))
    steps = {}
    for task in plan.record.tasks:
        spec = next(h for h in run.record.hosts if h.name == task.host)
        agent = HostAgent(spec.connect(), spec.python, spec.root)
        steps[task.name] = launcher.argv(task.host, agent, "boxed-1", task)
    return steps, plan


def test_with_pyxis_every_step_of_a_node_runs_in_its_container_and_no_runtime_inside(monkeypatch, home):
    acquired, imports, said = allocated(boxed(), PYXIS_HELP, monkeypatch)
    allocation = SlurmAllocation.from_wire(acquired.state)
    assert sorted(allocation.containers) == ["n1", "n2", "n3"]
    assert "containers: pyxis; importing nvcr.io/nvidia/tensorflow:25.01-tf2-py3 on n1, n2, n3" in said
    assert "importing nvcr.io/nvidia/tensorflow:25.01-tf2-py3 (10s; imports end at container.pull_timeout)" in said
    ((argvs, timeout),) = imports  # one import step per node, all at once, before any task
    assert timeout == 600 and sorted(argvs) == ["n1", "n2", "n3"]
    assert argvs["n2"][:2] == ["srun", "--jobid=5"] and "--nodelist=n2" in argvs["n2"] and argvs["n2"][-1] == "true"
    assert "--container-image=nvcr.io#nvidia/tensorflow:25.01-tf2-py3" in argvs["n2"]
    steps, plan = steps_of(acquired)
    for argv in steps.values():
        monitor = argv.index("python3")  # the image's Python runs the monitor, in the container
        assert argv[monitor + 1 : monitor + 3] == ["-I", "-S"] and argv[-4:-1] == ["monitor", str(home), "boxed-1"]
        flags = argv[:monitor]
        assert "--container-image=nvcr.io#nvidia/tensorflow:25.01-tf2-py3" in flags
        assert "--container-name=tfctl-boxed-1" in flags and "--no-container-remap-root" in flags
        (mounts,) = [f for f in flags if f.startswith("--container-mounts=")]
        assert f"{home}:{home}" in mounts and "/data:/data:ro" in mounts
    assert "--gpus=1" in steps["worker:0"] and "--exact" in steps["worker:0"]  # Slurm still places the GPUs
    for task in plan.record.tasks:  # the monitor gets a bare task: it starts no runtime
        assert task.container is None
        assert task.command.startswith("python3 train.py")  # `{python}`: the image's
    host = next(h for h in draft(acquired.config, "boxed-1", acquired.state).record.hosts if h.name == "n1")
    assert host.python == "python3"
    transport = host.connect()
    assert isinstance(transport, SlurmTransport)
    assert "--container-name=tfctl-boxed-1" in transport._argv("true")  # the supervisor too, and `exec`
    relay = transport._relay_argv("2222")
    assert not any(word.startswith("--container") for word in relay)  # plumbing runs on the node itself
    assert isinstance(host.transport, SlurmStepSpec) and host.transport.container == allocation.containers["n1"].options
    record = draft(acquired.config, "boxed-1", acquired.state).record
    (prune,) = SlurmBackend().prune_targets(record)
    assert prune.spec.python is None  # pruned from here, by this machine's Python, not a path in the image


def test_without_pyxis_the_runtime_runs_inside_each_step_as_before(monkeypatch, home):
    acquired, imports, said = allocated(boxed(), PLAIN_HELP, monkeypatch)
    assert SlurmAllocation.from_wire(acquired.state).containers == {}
    assert imports == []
    assert any("the node's runtime in each step (not pyxis: this Slurm's srun has no" in line for line in said)
    steps, plan = steps_of(acquired)
    assert not any(word.startswith("--container") for argv in steps.values() for word in argv)
    for task in plan.record.tasks:  # the monitor starts the task's container with the node's runtime
        assert task.container is not None and task.container.image == IMAGE and task.container.runtime == "auto"


def test_an_image_pyxis_cannot_import_fails_the_start_and_ends_the_allocation(monkeypatch, home):
    calls: list[list[str]] = []
    with pytest.raises(SlurmError) as caught:
        allocated(boxed(), PYXIS_HELP, monkeypatch, failed={"n2": "pyxis: failed to import docker image"}, calls=calls)
    assert ["scancel", "5"] in calls
    assert caught.value.message.endswith("containers:\n  n2: pyxis: failed to import docker image")
    assert "registry#path:tag" in (caught.value.hint or "")


def test_importing_runs_every_nodes_step_at_once_and_ends_those_past_the_timeout():
    waited: list[float] = []
    began = time.monotonic()
    failed = import_images(
        {
            "n1": ["sh", "-c", "exit 0"],
            "n2": ["sh", "-c", "echo 'pyxis: importing'; echo 'pyxis: failed to import docker image' >&2; exit 1"],
            "n3": ["sleep", "30"],
            "n4": ["sleep", "30"],
        },
        1.0,
        waited.append,
    )
    took = time.monotonic() - began
    assert 1 <= len(waited) <= 3 and waited == sorted(waited) and waited[0] >= 0.25  # said while waiting
    assert failed == {
        "n2": "pyxis: failed to import docker image",
        "n3": "importing the image took more than 1s (container.pull_timeout)",
        "n4": "importing the image took more than 1s (container.pull_timeout)",
    }
    assert took < 5  # one timeout for all, and SIGTERM ended the sleeps at once


def test_slurm_containers_takes_only_its_three_ways():
    with pytest.raises(ConfigError) as caught:
        boxed(slurm=", containers: podman")
    assert "slurm.containers: expected one of auto, pyxis, runtime, found a string (`podman`)" in str(caught.value)
    assert settings_of(boxed(slurm=", containers: pyxis")).containers == "pyxis"
    assert settings_of(boxed()).containers == "auto"


# -- a whole run, on stand-ins for Slurm's commands whose srun takes pyxis's flags -------------

STAND_INS = {
    "sbatch": "import sys\nsys.stdin.read()\nprint('5')\n",
    "squeue": "if not os.path.exists(CANCELLED):\n    print('5|RUNNING|None|localhost')\n",
    "scontrol": (
        "if sys.argv[1:3] == ['show', 'hostnames']:\n    print('localhost')\n"
        "else:\n    state = 'CANCELLED' if os.path.exists(CANCELLED) else 'RUNNING'\n"
        "    print('JobId=5 JobState=%s Reason=None BatchHost=localhost' % state)\n"
    ),
    "scancel": "open(CANCELLED, 'w').close()\n",
    "sacct": "sys.exit('Slurm accounting storage is disabled')\n",
    # Each step runs here, as the node; pyxis's flags are logged, not obeyed (no container).
    "srun": (
        "args = sys.argv[1:]\n"
        "if args == ['--help']:\n    print(HELP)\n    sys.exit(0)\n"
        "with open(os.path.join(STATE, 'steps.log'), 'a') as log:\n    log.write(json.dumps(args) + '\\n')\n"
        "command = args[next(i for i, a in enumerate(args) if not a.startswith('-')) :]\n"
        "os.execvp(command[0], command)\n"
    ),
}


def stand_in_slurm(base: Path) -> dict[str, str]:
    """Slurm's commands as stand-ins in `base`, the node being this machine: the environment
    tfctl runs with."""
    state, bin_dir = base / "state", base / "bin"
    state.mkdir()
    bin_dir.mkdir()
    head = (
        f"#!{sys.executable}\nimport json, os, sys\nSTATE = {str(state)!r}\n"
        f"CANCELLED = os.path.join(STATE, 'cancelled')\nHELP = {PYXIS_HELP!r}\n"
    )
    for name, body in STAND_INS.items():
        (bin_dir / name).write_text(head + body)
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "", "TFCTL_CONTROLLER_JOB": ""}


def test_an_up_on_a_slurm_with_pyxis_runs_every_step_in_the_nodes_container(tmp_path, home):
    env = stand_in_slurm(tmp_path)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: pyx
backend: slurm
slurm: {{nodes: 1, time: "00:10:00", controller: login}}
grace_period: 2
container:
  image: {IMAGE}
  python: {sys.executable}
command: "{{python}} {FAKE_TASK} --name {{job_name}}{{task_index}} --port -1 --lines 3 --sleep -1"
jobs:
  ps: {{count: 1}}
  worker: {{count: 1}}
""")
    up = tfctl("-f", str(cluster), "up", "-d", home=home, env=env)
    run_id = up.stdout.strip()
    try:
        assert up.returncode == 0, up.stderr
        assert f"containers: pyxis; importing {IMAGE} on localhost" in up.stderr
        steps = [json.loads(line) for line in (tmp_path / "state" / "steps.log").read_text().splitlines()]
        assert steps[0][-1] == "true" and f"--job-name={run_id}:import" in steps[0]  # the image imported first
        for step in steps:  # and every step after it, the supervisor's and the monitors', in the container
            assert f"--container-name=tfctl-{run_id}" in step, step
            assert "--container-image=nvcr.io#nvidia/tensorflow:25.01-tf2-py3" in step, step
        monitors = [step for step in steps if "monitor" in step]
        assert sorted(step[-1] for step in monitors) == ["ps:0", "worker:0"]
        for step in monitors:
            assert step[step.index(sys.executable) :][1:3] == ["-I", "-S"]  # the image's Python runs it
        assert not any(word in " ".join(step) for step in steps for word in ("podman", "docker", "apptainer"))
        assert not list(home.glob(f"hosts/*/tasks/{run_id}/*/tether.fifo"))  # no runtime, no tether
        status = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home, env=env).stdout)
        assert {t["task"]: t["state"] for t in status["tasks"]} == {"ps:0": "running", "worker:0": "running"}
        logs = tfctl("-f", str(cluster), "logs", "worker:0", home=home, env=env).stdout
        assert "worker0 line 2" in logs
    finally:
        down = tfctl("-f", str(cluster), "down", home=home, env=env)
    assert down.returncode == 0, down.stderr
    assert "0 remain" in down.stderr and (tmp_path / "state" / "cancelled").exists()
