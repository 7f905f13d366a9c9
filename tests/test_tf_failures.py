"""TF failures tfctl must explain and end, with real TensorFlow processes on localhost."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, REPO, free_ports, marked_processes, spawn_tfctl, tfctl, wait_for_line

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"),
]
MNIST = REPO / "examples" / "mnist"
WORKER = (
    "{python} train.py --job_name=worker --task_index={task_index} --ps_hosts={ps_hosts} "
    "--worker_hosts={worker_hosts} --train_steps 100000000"
)


# Worker 0 trains ~20 s; TF looks again every second (--recovery_wait) instead of every 30 s.
HOGWILD = "--place own --print arrays --steps 200 --every 10 --pause 0.1 --recovery_wait 1 --summaries_secs 0"


# Both train on worker 0's variables ~30 s; the chief prints bare arrays, worker 1 step lines.
SUPERVISOR_RATE = (
    "--place chief --print steps --chief_print arrays --steps 600 --every 5 --pause 0.05 --recovery_wait 1"
)


def run_left(run_id: str) -> list[int]:
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


def test_worker_whose_ps_is_gone_is_diagnosed_then_failed_as_hung(tmp_path: Path, home: Path) -> None:
    ps_port, w_port = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    # The ps listens long enough to pass start-up, then exits: the worker's CreateSession waits forever.
    cluster.write_text(f"""name: hang
workdir: {MNIST}
fail_on_ps_exit: false
hang_timeout: 20
grace_period: 3
jobs:
  ps:
    hosts: [localhost:{ps_port}]
    command: "{{python}} {FAKE_TASK} --name ps --port {ps_port} --sleep 1"
  worker:
    hosts: [localhost:{w_port}]
    command: "{WORKER}"
""")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()

    def worker() -> dict:
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        return next(t for t in tasks if t["task"] == "worker:0")

    seen = wait_until(
        worker,
        60,
        "a diagnosis of worker:0",
        until=lambda w: w["state"] != "running" or w["diagnosis"] is not None,
        interval=1,
    )
    diagnosis = seen["diagnosis"] if seen["state"] == "running" else None
    assert diagnosis is not None, seen
    assert diagnosis["kind"] == "waiting_for_peer" and diagnosis["peer"] == "ps:0"
    assert "CreateSession still waiting for response from worker: /job:ps/replica:0/task:0" in diagnosis["evidence"]
    assert f"ps:0 (localhost:{ps_port}), but ps:0 exited with code 0 at" in diagnosis["cause"]
    # TF never gives up; tfctl's watcher does, naming the hang and its cause.
    record = wait_until(
        lambda: json.loads(tfctl("runs", "--json", home=home).stdout)[-1],
        60,
        "the run's end",
        until=lambda record: record["state"] != "running",
        interval=1,
    )
    assert record["state"] == "failed", record
    assert "worker:0 has been stuck for over 20s" in record["reason"] and "ps:0" in record["reason"]
    assert run_left(run_id) == []


def test_ps_killed_mid_run_fails_the_job_naming_the_ps(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: pskill
workdir: {MNIST}
grace_period: 3
command: "{WORKER.replace("--job_name=worker", "--job_name={job_name}")}"
jobs:
  ps: [localhost:{ports[0]}]
  worker: [localhost:{ports[1]}, localhost:{ports[2]}]
""")
    up = spawn_tfctl("-f", str(cluster), "up", home=home)
    assert up.stdout is not None
    try:
        wait_for_line(up.stdout, "[worker:0] step ", 90)  # training started
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        ps_pid = next(t["pid"] for t in tasks if t["task"] == "ps:0")
        os.kill(ps_pid, signal.SIGKILL)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 1
    assert "job failed: ps:0 on localhost was killed by signal 9" in err
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_left(run_id) == []


class Streams:
    """An attached `tfctl up`'s stdout and stderr lines, each with when it was read."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str, str]] = []  # (monotonic time, "out"/"err", line)
        self.threads = [
            threading.Thread(target=self._read, args=(stream, name), daemon=True)
            for stream, name in ((proc.stdout, "out"), (proc.stderr, "err"))
        ]
        for t in self.threads:
            t.start()

    def _read(self, stream: IO[str], name: str) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), name, line.rstrip("\n")))

    def first(self, name: str, text: str) -> tuple[float, str]:
        return next((t, line) for t, n, line in self.lines if n == name and text in line)


def hogwild_up(
    tmp_path: Path, home: Path, policy: str, hang_timeout: int = 120, args: str = HOGWILD
) -> tuple[subprocess.Popen, Streams]:
    """An attached `tfctl up` of the Hogwild program on two local workers, run to its end."""
    ports = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: hogwild
workdir: {REPO / "tests" / "tasks"}
success_policy: {policy}
hang_timeout: {hang_timeout}
grace_period: 3
jobs:
  worker:
    hosts: [localhost:{ports[0]}, localhost:{ports[1]}]
    command: "{{python}} hogwild.py {args}"
""")
    up = spawn_tfctl("-f", str(cluster), "up", home=home)
    streams = Streams(up)
    try:
        up.wait(timeout=150)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=30)
    for t in streams.threads:
        t.join(timeout=5)
    return up, streams


def test_hogwild_worker_whose_variables_are_never_initialised_is_named_live_and_at_the_end(
    tmp_path: Path, home: Path
) -> None:
    """Worker 1 places its variables on its own task; only the chief's init op runs, so it waits
    for ever while worker 0 trains, printing bare arrays no pattern reads. The run succeeds (the
    chief's), and tfctl must still name worker 1, live and at the end."""
    up, streams = hogwild_up(tmp_path, home, "chief")
    err = "\n".join(line for _, n, line in streams.lines if n == "err")
    assert up.returncode == 0, err  # the chief's run did succeed ...
    waited_at, _ = streams.first("out", "[worker:1] INFO:tensorflow:Waiting for model to be ready")
    noted_at, note = streams.first("err", "worker:1: the chief worker:0 trains")
    # ... but worker 1 is named while the chief trains, as soon as TF repeats its wait,
    named_after = noted_at - waited_at
    print(f"worker:1 named {named_after:.1f}s after its first 'Waiting for model' line")
    assert 0 < named_after < 20, named_after
    assert "this worker's own task" in err and "replica_device_setter" in err
    # ... and again when the run ends, before the success line.
    ending = "worker:1: never got past waiting: the chief worker:0 trained, then"
    assert any(ending in line for _, n, line in streams.lines if n == "err"), err
    ended_at, _ = streams.first("err", ending)
    assert ended_at <= streams.first("err", "job succeeded")[0]
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_left(run_id) == []


def test_hogwild_under_all_workers_fails_as_hung_with_the_cause_not_device_filters(tmp_path: Path, home: Path) -> None:
    """Once worker 0 is done, worker 1's next look at the model waits for worker 0 at CreateSession:
    that retry is not the story, its never-initialised variables are."""
    # Worker 0 trains ~6 s; on a loaded host TF's start-up takes up to ~30 s more, and worker 1's
    # retry logs its wait 3 s after worker 0 has gone: all well inside the 60 s.
    up, streams = hogwild_up(
        tmp_path,
        home,
        "all_workers",
        hang_timeout=60,
        args=HOGWILD.replace("--steps 200", "--steps 60").replace("--recovery_wait 1", "--recovery_wait 3"),
    )
    err = "\n".join(line for _, n, line in streams.lines if n == "err")
    assert up.returncode == 1, err
    worker1 = [line for _, n, line in streams.lines if n == "out" and line.startswith("[worker:1]")]
    record = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]
    assert record["state"] == "failed", record
    cause = "the chief worker:0 trained, then worker:0 exited with code 0"
    if "worker:1 has been stuck for over 60s" in record["reason"]:
        assert any(  # worker 1's retry, a new session that waits for the finished worker 0
            "CreateSession still waiting for response from worker: /job:worker/replica:0/task:0" in line
            for line in worker1
        ), "\n".join(worker1[-15:] + [err])
        assert cause in record["reason"], record["reason"]
    else:  # TF's other end of that retry: worker 0 exited during its GetStatus, which fails it
        print("worker 1's retry met worker 0 exiting: UNAVAILABLE")
        assert record["reason"] == "worker:1 on localhost exited with code 1", record["reason"]
        assert any("UnavailableError" in line for line in worker1), "\n".join(worker1[-15:])
        assert f"worker:1: never got past waiting: {cause}" in err, err
    assert "device_filters" not in record["reason"] and "device_filters" not in err
    assert run_left(record["run_id"]) == []


def test_a_silent_hogwild_worker_with_tfs_defaults_is_named_live_and_at_the_end(tmp_path: Path, home: Path) -> None:
    """Issue 33's run: TF's default log level, so worker 1's wait for variables nobody
    initialises says nothing; worker 0 prints bare arrays and exits 0 before worker 1's first
    retry (TF's 30 s). Only worker 0's output tells: tfctl names worker 1 live, once the silence
    lasts hang_timeout, and at the end."""
    args = "--place own --print arrays --steps 500 --every 1 --pause 0.05 --summaries_secs 0 --log_level default"
    up, streams = hogwild_up(tmp_path, home, "chief", hang_timeout=10, args=args)
    err = "\n".join(line for _, n, line in streams.lines if n == "err")
    assert up.returncode == 0, err
    assert not any("Waiting for model" in line for _, n, line in streams.lines if n == "out")  # TF said nothing
    noted_at, note = streams.first("err", "note: worker:1 printed nothing for")
    assert "while worker:0 printed" in note and "it is not training" in note
    ended_at, ending = streams.first("err", "worker:1: printed nothing for")
    assert "while worker:0 printed" in ending and "it never trained" in ending
    assert noted_at < ended_at < streams.first("err", "job succeeded")[0]
    assert "set_verbosity" in err and "replica_device_setter" in err and "device_filters" not in err
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_left(run_id) == []


def test_a_supervisor_chiefs_global_step_sec_0_line_makes_no_straggler(tmp_path: Path, home: Path) -> None:
    """tf.train.Supervisor's step counter logs `global_step/sec: 0` as the chief starts, then
    nothing for save_summaries_secs (120 s); a chief printing no step lines of its own is then no
    straggler beside a worker that prints them: that 0 is no rate."""
    ports = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: svrate
workdir: {REPO / "tests" / "tasks"}
grace_period: 3
jobs:
  worker:
    hosts: [localhost:{ports[0]}, localhost:{ports[1]}]
    command: "{{python}} hogwild.py {SUPERVISOR_RATE}"
""")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    seen: list[dict[str, dict]] = []

    def poll() -> dict[str, dict]:
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        seen.append({t["task"]: t for t in tasks})
        return seen[-1]

    wait_until(poll, 120, "the chief's end", until=lambda t: t["worker:0"]["state"] != "running", interval=1)
    both_rated = [s for s in seen if s["worker:1"]["steps_per_sec"] and s["worker:0"]["state"] == "running"]
    assert both_rated, seen  # the worker trained beside the running chief: a straggler could be called
    assert all("straggler" not in s["worker:0"]["flags"] for s in seen), [s["worker:0"] for s in seen]
    # `global_step/sec: 0` is no rate: none, or one from the steps Supervisor's own lines name
    assert all(s["worker:0"]["steps_per_sec"] != 0 for s in both_rated), [s["worker:0"] for s in both_rated]
    logs = tfctl("-f", str(cluster), "logs", "--run", run_id, "worker:0", home=home).stdout
    if not any(line.endswith("INFO:tensorflow:global_step/sec: 0") for line in logs.splitlines()):
        wait_until(
            lambda: run_left(run_id), 60, "the run's processes to end", until=lambda left: left == [], interval=1
        )
        pytest.skip("TF's Supervisor logged no `global_step/sec: 0` in this run (timing on a loaded machine)")
    wait_until(lambda: run_left(run_id), 60, "the run's processes to end", until=lambda left: left == [], interval=1)
