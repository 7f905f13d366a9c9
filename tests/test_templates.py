"""Every template under templates/ runs for real under tfctl, to the end, with nothing left running.

Each test copies a template directory (as `tfctl init` would), moves its ports to free ones and its
checkpoints into tmp_path, cuts the step count, runs `tfctl -f <copy>/cluster.yaml up` and checks
the exit code, the chief's final summary line, `job succeeded`, and (through conftest's autouse
leak guard) that no process of the run survives.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import struct
from pathlib import Path

import pytest

from bench.waiting import wait_until
from tests.conftest import REPO, no_warnings, tfctl
from tfctl.supervisor.procfs import live_pids, proc_env_markers
from tfctl.tf.noise import NOISE

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed (pip install -e '.[tf]')"
    ),
]

TEMPLATES = REPO / "templates"
STEP = re.compile(r"^\[(\w+:\d+)\]\s+step (\d+) loss ([\d.]+|nan) steps/s ([\d.]+)", re.M)
FINAL = re.compile(
    r"^\[(\w+:\d+)\]\s+final step (\d+) loss (\S+) accuracy ([\d.]+) time ([\d.]+)s"
    r" steps/s ([\d.]+) checkpoint (\S+)$",
    re.M,
)


def copy_template(name: str, tmp_path: Path, train_steps: int | None = None, extra: str = "") -> Path:
    """The template as a user's project, with fewer steps and `extra` top-level keys. It names no
    port (its hosts pick free ones at `up`), so no two runs of the shipped files collide."""
    dst = tmp_path / name
    shutil.copytree(TEMPLATES / name, dst)
    cluster = dst / "cluster.yaml"
    text = cluster.read_text()
    assert "localhost" in text and not re.search(r"localhost:\d", text)
    assert "--checkpoint_dir=$TFCTL_RUN_DIR/checkpoints" in text  # under the test's TFCTL_HOME
    if train_steps is not None:
        text, n = re.subn(r"--train_steps=\d+", f"--train_steps={train_steps}", text)
        assert n == 1
    cluster.write_text(text.rstrip("\n") + "\n" + extra)
    return cluster


def run_up(cluster: Path, home: Path, timeout: float = 240, healthy: bool = True):
    """`healthy`: every task trains, so the run must print no note and no warning."""
    up = tfctl("-f", str(cluster), "up", home=home, timeout=timeout)
    assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-5000:]
    assert "job succeeded" in up.stderr
    if healthy:
        no_warnings(up.stderr)
    folded_noise(cluster, home, up.stdout)
    return up


def shown_lines(stdout: str) -> list[str]:
    """Task lines as `up` or `logs` printed them, without their `[task]` prefixes."""
    return [line.split("]", 1)[1].lstrip() for line in stdout.splitlines() if line.startswith("[")]


def folded_noise(cluster: Path, home: Path, live: str) -> None:
    """TF's healthy start-up noise is folded from the live stream and said once per task, while
    `tfctl logs` after the fact still shows every line."""
    live_noise = [line for line in shown_lines(live) if NOISE.match(line)]
    assert live_noise == [], live_noise[:5]
    stored = tfctl("-f", str(cluster), "logs", home=home)
    noisy_tasks = {
        line[1:].split("]", 1)[0] for line in stored.stdout.splitlines() if NOISE.match(line.split("]", 1)[-1].lstrip())
    }
    for task in noisy_tasks:
        assert f"[{task}]" in live and f"`tfctl logs {task}` shows every line)" in live, task


def final_line(stdout: str, chief: str) -> re.Match:
    finals = list(FINAL.finditer(stdout))
    assert len(finals) == 1 and finals[0].group(1) == chief, stdout[-3000:]
    return finals[0]


def task_states(home: Path) -> dict[str, dict]:
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    return {t["task"]: t for t in json.loads(tfctl("status", "--json", "--run", run_id, home=home).stdout)["tasks"]}


def check_common(up, chief: str, steps: int, min_accuracy: float = 0.8, overshoot: int = 0) -> re.Match:
    """`overshoot`: how far past `steps` asynchronous workers may take the global step."""
    assert STEP.search(up.stdout), up.stdout[-3000:]
    final = final_line(up.stdout, chief)
    assert steps <= int(final.group(2)) <= steps + overshoot
    assert float(final.group(4)) >= min_accuracy
    assert float(final.group(6)) > 0
    ckpt = Path(final.group(7))
    assert ckpt.name == "checkpoints" and ckpt.parent.parent.name == "work"  # $TFCTL_RUN_DIR/checkpoints
    assert ckpt.is_dir() and (ckpt / "checkpoint").is_file(), f"no checkpoint in {ckpt}"
    return final


def summaries(logdir: Path) -> dict[str, dict[str, dict[int, float]]]:
    """{task folder: {tag: {step: value}}} of the TensorBoard event files under a run's logdir,
    read as TensorBoard reads them (TFRecords of Event protos: a length, its CRC, the record, its CRC)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.util.tensor_util import make_ndarray

    found: dict[str, dict[str, dict[int, float]]] = {}
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        tags = found.setdefault(str(path.parent.relative_to(logdir)), {})
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                number = value.simple_value if value.HasField("simple_value") else make_ndarray(value.tensor).item()
                tags.setdefault(value.tag, {})[event.step] = number
    return found


def check_summaries(cluster: Path, home: Path, final: re.Match, writers: list[str], every_step: bool = True) -> None:
    """The run left TensorBoard scalars in its logdir (`logs/RUN_ID` beside its cluster file): in
    a folder per task of `writers`, loss and accuracy by step up to the final one (at each step,
    or with `every_step` False at 20 or more); the chief, the test accuracy it printed."""
    runs = list((cluster.parent / "logs").iterdir())
    assert len(runs) == 1, sorted(str(p.relative_to(cluster.parent)) for p in (cluster.parent / "logs").rglob("*"))
    (run_dir,) = runs
    assert run_dir.name == json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    found = summaries(run_dir)
    assert sorted(found) == sorted(writers), found.keys()
    last = int(final.group(2))
    for folder, tags in found.items():
        assert {"loss", "accuracy"} <= set(tags), (folder, tags.keys())
        steps = sorted(tags["loss"])
        assert steps == sorted(tags["accuracy"]) and steps[-1] <= last and len(steps) >= (last if every_step else 20)
        assert all(0 <= a <= 1 for a in tags["accuracy"].values()) and all(loss >= 0 for loss in tags["loss"].values())
    chief = found[writers[0]]
    assert chief["test_accuracy"] == {last: pytest.approx(float(final.group(4)), abs=5e-5)}


def test_between_graph_async(tmp_path: Path, home: Path) -> None:
    cluster = copy_template("between-graph-async", tmp_path, train_steps=400)
    up = run_up(cluster, home)
    # Async: the other worker's step in flight when the chief stops still counts (CI saw 402).
    final = check_common(up, "worker:0", 400, overshoot=4)
    check_summaries(cluster, home, final, ["worker_0", "worker_1"], every_step=False)  # each its own steps
    assert "Started server with target: grpc://" in up.stdout  # TF's INFO lines are kept
    states = task_states(home)
    assert states["worker:0"]["step"] == int(final.group(2))  # `status` read it from the real log
    assert states["worker:1"]["step"] is not None and states["ps:0"]["step"] is None
    assert states["ps:0"]["state"] == "stopped"  # the ps never exits by itself
    assert states["worker:0"]["state"] == "succeeded"


def test_between_graph_sync_all_workers_exit_by_themselves(tmp_path: Path, home: Path) -> None:
    cluster = copy_template("between-graph-sync", tmp_path, train_steps=150)
    up = run_up(cluster, home)
    final = check_common(up, "worker:0", 150)
    check_summaries(cluster, home, final, ["worker_0", "worker_1"], every_step=False)  # tokens: either may step
    # Lock step: both workers trained (a global step needs a gradient from each).
    assert re.search(r"^\[worker:1\]\s+worker 1: done after \d+ local steps", up.stdout, re.M), up.stdout[-3000:]
    assert not re.search(r"Exception in thread QueueRunnerThread", up.stdout)
    states = task_states(home)
    # The non-chief was not left blocked on the sync token queue for tfctl to kill: it exited 0.
    assert states["worker:1"]["state"] == "succeeded" and states["worker:1"]["exit_code"] == 0, states
    assert states["worker:0"]["state"] == "succeeded"
    assert states["worker:0"]["step"] == int(final.group(2))


FAKE_CHIEF = '''
"""Plays a chief that vanishes without closing the sync token queue once the target is reached."""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("train", "train.py")
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
tf = train.tf
args = train.parse_args(sys.argv[1:])
cluster = tf.train.ClusterSpec({"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")})
server = tf.train.Server(cluster, job_name="worker", task_index=0)
x_train = train.load_data(None)[0]
with tf.device(tf.train.replica_device_setter(worker_device="/job:worker/task:0", cluster=cluster)):
    model = train.build_model(x_train.shape[1], 10, 0.1, cluster.num_tasks("worker"))
accumulated = model["opt"]._accumulator_list[0][0].num_accumulated()
config = tf.ConfigProto(device_filters=["/job:ps", "/job:worker/task:0"])
with tf.Session(server.target, config=config) as s:
    s.run(tf.global_variables_initializer())
    s.run(model["global_step"].assign(args.train_steps - 1))
    train.log("fake chief: initialised; no queue runner, so no token will ever come")
    while s.run(accumulated) < 1:  # worker 1 pushed its gradient: it now waits for a token
        time.sleep(0.2)
    s.run(model["global_step"].assign(args.train_steps))
    train.log("fake chief: global step at the target; exiting without closing the token queue")
'''


def test_between_graph_sync_watchdog_unblocks_a_worker_left_on_the_token_queue(tmp_path: Path, home: Path) -> None:
    """worker:0 is a stand-in chief that reaches the target and vanishes without closing the queue.

    Without the watchdog, worker:1 would wait on the sync token queue forever (and the run with
    success_policy all_workers would never end); with it, worker:1 closes the queue and exits 0.
    """
    cluster = copy_template("between-graph-sync", tmp_path, train_steps=50)
    (cluster.parent / "fake_chief.py").write_text(FAKE_CHIEF)
    text = cluster.read_text().replace(
        "{python} train.py", "{python} $(test {job_name}{task_index} = worker0 && echo fake_chief.py || echo train.py)"
    )
    text = re.sub(r"success_policy: \w+", "success_policy: all_workers", text)
    cluster.write_text(text)
    up = run_up(cluster, home, timeout=180, healthy=False)  # its stand-in chief never trains
    assert "worker:0: never logged a training step, while worker:1 did" in up.stderr
    assert "[worker:0] fake chief: global step at the target" in up.stdout
    assert re.search(r"^\[worker:1\]\s+watchdog: global step 50 >= 50", up.stdout, re.M), up.stdout[-3000:]
    assert re.search(r"^\[worker:1\]\s+worker 1: done after", up.stdout, re.M)
    states = task_states(home)
    assert states["worker:1"]["state"] == "succeeded" and states["worker:1"]["exit_code"] == 0


def test_parameter_server(tmp_path: Path, home: Path) -> None:
    cluster = copy_template("parameter-server", tmp_path, train_steps=200)
    up = run_up(cluster, home)
    final = check_common(up, "chief:0", 200)
    check_summaries(cluster, home, final, ["chief_0"], every_step=False)  # every 10th: 20 points
    for task in ("ps:0", "worker:0", "worker:1"):
        assert re.search(rf"^\[{task}\]\s+\w+ \d: serving", up.stdout, re.M), task
    states = task_states(home)
    assert states["chief:0"]["state"] == "succeeded"
    assert states["chief:0"]["step"] == int(final.group(2))
    assert {states[t]["state"] for t in ("ps:0", "worker:0", "worker:1")} == {"stopped"}


def test_multi_worker_mirrored(tmp_path: Path, home: Path) -> None:
    cluster = copy_template("multi-worker-mirrored", tmp_path, train_steps=200)
    up = run_up(cluster, home)
    final = check_common(up, "worker:0", 200)
    check_summaries(cluster, home, final, ["worker_0"])  # all-reduced: the same on worker 1, which writes none
    # All-reduce: both workers computed the same loss at the same step, and the same accuracy.
    steps = {(m.group(1), m.group(2)): m.group(3) for m in STEP.finditer(up.stdout)}
    assert steps[("worker:0", "200")] == steps[("worker:1", "200")]
    assert f"worker 1: done, step 200 accuracy {final.group(4)}" in up.stdout
    assert "tmp-worker-1" not in {p.name for p in Path(final.group(7)).iterdir()}
    states = task_states(home)
    assert states["worker:0"]["step"] == states["worker:1"]["step"] == 200
    # Both workers left by themselves (a stop would have them save and exit 143).
    assert states["worker:0"]["state"] == states["worker:1"]["state"] == "succeeded", states


MORE_STEPS = 400  # after a resume: enough for every worker of an asynchronous job to log a step


def down_then_resume(
    tmp_path: Path, home: Path, template: str, chief: str, saved_line: str, overshoot: int = 0, extra: str = ""
) -> dict[str, dict]:
    """Start the template for many steps, `down` it mid-training, then `up --resume` it for MORE_STEPS
    steps more: the checkpoint `saved_line` names must be at the last step trained (nothing lost
    but the step in flight), and the resumed run must start there and finish MORE_STEPS later
    (`overshoot`: how far past that asynchronous workers may take the global step). Returns the
    stopped run's task states."""
    cluster = copy_template(template, tmp_path, train_steps=100000, extra=extra)
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()

    def chief_step() -> int:
        logs = tfctl("logs", "--run", run_id, chief, home=home).stdout
        return max((int(m.group(2)) for m in STEP.finditer(logs)), default=0)

    wait_until(chief_step, 180, f"{chief} at step 200", until=lambda step: step >= 200, interval=0.5)
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    logs = tfctl("logs", "--run", run_id, home=home).stdout
    saved = re.search(rf"^\[{chief}\]\s+{saved_line} (\d+) in ", logs, re.M)
    if not saved:  # what the chief said last, and how every task ended
        ends = {task: (s["state"], s["exit_code"], s.get("signal")) for task, s in task_states(home).items()}
        said = tfctl("logs", "--run", run_id, chief, home=home).stdout
        pytest.fail(f"{chief} said no '{saved_line}'; tasks: {ends}\n{said[-4000:]}")
    step = int(saved.group(1))
    assert step + overshoot >= max(int(m.group(2)) for m in STEP.finditer(logs)) >= 200  # saved where it stopped
    states = task_states(home)

    cluster.write_text(cluster.read_text().replace("--train_steps=100000", f"--train_steps={step + MORE_STEPS}"))
    resumed = tfctl("-f", str(cluster), "up", "--resume", home=home, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:] + resumed.stdout[-3000:]
    began = re.search(rf"^\[{chief}\]\s+resumed from \S+ at (global )?step (\d+)$", resumed.stdout, re.M)
    assert began, resumed.stdout[-3000:]
    if overshoot:  # asynchronous: another worker may step before the chief reads the step it restored;
        # the only other checkpoint is step 0's, so a start at `step` or past it is the one `down` saved
        assert step <= int(began.group(2)) <= step + MORE_STEPS
    else:
        assert int(began.group(2)) == step
    assert step + MORE_STEPS <= int(final_line(resumed.stdout, chief).group(2)) <= step + MORE_STEPS + overshoot
    no_warnings(resumed.stderr)
    return states


def test_multi_worker_mirrored_saves_on_down_and_a_resumed_run_loses_no_step(tmp_path: Path, home: Path) -> None:
    """`down` sends SIGTERM to both workers at once; TF's PreemptionCheckpointHandler has them
    finish the step in flight and save at the same step."""
    states = down_then_resume(
        tmp_path, home, "multi-worker-mirrored", "worker:0", "worker 0: SIGTERM: saved a checkpoint at step"
    )
    assert {states[t]["exit_code"] for t in ("worker:0", "worker:1")} == {143}
    assert states["worker:0"]["step"] == states["worker:1"]["step"]


def test_between_graph_async_saves_on_down_and_a_resumed_run_loses_no_step(tmp_path: Path, home: Path) -> None:
    """TF1: the chief's MonitoredTrainingSession saves as it closes, while the ps waits for it."""
    states = down_then_resume(
        tmp_path,
        home,
        "between-graph-async",
        "worker:0",
        "worker 0: SIGTERM: saved a checkpoint at global step",
        overshoot=4,
    )
    assert states["worker:0"]["exit_code"] == 143  # the chief saved and left by itself
    assert {s["state"] for s in states.values()} == {"stopped"}


def test_parameter_server_saves_on_down_and_a_resumed_run_loses_no_step(tmp_path: Path, home: Path) -> None:
    """The chief lets the steps in flight finish and saves while the ps (holding the variables)
    waits for it to go."""
    states = down_then_resume(
        tmp_path, home, "parameter-server", "chief:0", "chief: SIGTERM: saved a checkpoint at global step"
    )
    assert states["chief:0"]["exit_code"] == 143  # it saved and left by itself (the ps wait for it, then go)
    assert {s["state"] for s in states.values()} == {"stopped"}


def test_a_sigkilled_between_graph_worker_restarts_rejoins_and_the_job_succeeds(tmp_path: Path, home: Path) -> None:
    cluster = copy_template("between-graph-async", tmp_path, train_steps=12000)
    text, n = re.subn(
        r"^  worker: \[(.*)\]$",
        r"  worker:\n    hosts: [\1]\n    restart: {policy: on-failure, max_restarts: 2, backoff: 1}",
        cluster.read_text(),
        flags=re.M,
    )
    assert n == 1
    cluster.write_text(text)
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()

    def worker1_log() -> str:
        return tfctl("logs", "--run", run_id, "worker:1", home=home).stdout

    trained = re.compile(r"step \d+ loss \S+ steps/s \S+ worker 1 ")
    wait_until(lambda: trained.search(worker1_log()) is not None, 120, "worker:1 training", interval=0.5)
    victims = [p for p in live_pids() if proc_env_markers(p) == (run_id, "worker:1")]
    assert victims
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    restarted = "tfctl: worker:1 was killed by signal 9; restart 1 of 2"
    wait_until(
        lambda: trained.search(worker1_log().partition(restarted)[2]) is not None,
        120,
        "worker:1 rejoining",
        interval=0.5,
    )
    run = wait_until(
        lambda: json.loads(tfctl("runs", "--json", home=home).stdout)[-1],
        240,
        "run end",
        until=lambda run: run["state"] != "running",
        interval=0.5,
    )
    assert run["state"] == "succeeded"
    states = task_states(home)
    assert (states["worker:0"]["state"], states["worker:0"]["restarts"]) == ("succeeded", 0)
    assert states["worker:1"]["restarts"] == 1
    chief = tfctl("logs", "--run", run_id, "worker:0", home=home).stdout
    final = re.search(r"final step (\d+)", chief)
    assert final and int(final.group(1)) >= 12000
