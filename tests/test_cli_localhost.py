"""The four verbs end to end through the real CLI, on a localhost cluster of small Python tasks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.waiting import wait_until
from tests.conftest import (
    fake,
    free_ports,
    marked_processes,
    port_listening,
    read_rest,
    spawn_tfctl,
    tfctl,
    wait_for_line,
)
from tfctl.controller.views.status_table import number_ranges
from tfctl.supervisor.procfs import is_same_process


def write_cluster(dirpath: Path, ports: list[int], ps: str, worker: str, name: str = "t", extra: str = "") -> Path:
    path = dirpath / "cluster.yaml"
    workers = ", ".join(f"localhost:{p}" for p in ports[1:])
    path.write_text(f"""name: {name}
grace_period: 2
startup_timeout: 20
{extra}
jobs:
  ps:
    hosts: [localhost:{ports[0]}]
    command: "{ps}"
  worker:
    hosts: [{workers}]
    command: "{worker}"
""")
    return path


def run_processes(run_id: str) -> list[int]:
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


def latest_run(home: Path) -> str:
    out = tfctl("runs", "--json", home=home)
    return json.loads(out.stdout)[-1]["run_id"]


def latest_state(home: Path, run_id: str) -> str:
    return str(json.loads((home / "runs" / run_id / "run.json").read_text())["state"])


def test_detached_up_status_logs_down(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake(
            f"--name w{{task_index}} --port $(({ports[1]} + {{task_index}} * {ports[2] - ports[1]})) "
            "--lines 4 --sleep -1"
        ),
    )
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    assert run_id.startswith("t-") and "tfctl" in up.stderr and "down" in up.stderr

    tasks = wait_until(
        lambda: json.loads(tfctl("status", "--json", "-f", str(cluster), home=home).stdout)["tasks"],
        20,
        "every task listening",
        until=lambda tasks: all(t["listening"] for t in tasks),
        interval=0.2,
    )
    assert [t["task"] for t in tasks] == ["ps:0", "worker:0", "worker:1"]
    for t, port in zip(tasks, ports):
        assert set(t) >= {"task", "job", "index", "host", "port", "state", "pid", "exit_code", "listening"}
        assert (t["host"], t["port"], t["state"], t["exit_code"], t["listening"]) == (
            "localhost",
            port,
            "running",
            None,
            True,
        )
        assert port_listening(port)
    assert tasks[1]["job"] == "worker" and tasks[1]["index"] == 0

    table = tfctl("-f", str(cluster), "status", home=home)
    assert run_id in table.stdout and "running" in table.stdout

    logs = tfctl("-f", str(cluster), "logs", "worker:1", home=home)
    lines = logs.stdout.splitlines()
    assert lines[0].startswith("[worker:1]") and "w1 started" in lines[0]
    assert [line.split()[-1] for line in lines[1:5]] == ["0", "1", "2", "3"]
    assert all(line.startswith("[worker:1]") for line in lines)
    assert "\x1b[" not in logs.stdout  # no colour when not a terminal
    tf_config = json.loads(lines[0].split("tf_config=", 1)[1])
    assert tf_config == {
        "cluster": {"ps": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"]},
        "task": {"type": "worker", "index": 1},
    }
    tail = tfctl("logs", "--file", str(cluster), "--tail", "1", "worker", home=home)
    assert tail.stdout.splitlines() == ["[worker:0] w0 line 3", "[worker:1] w1 line 3"]
    nothing = tfctl("logs", "--file", str(cluster), "--tail", "0", home=home)
    assert nothing.returncode == 0 and nothing.stdout == ""

    # The ps command is exec'd; each worker's `$((...))` keeps its sh as the parent: 1 + 2 * 2.
    assert len(run_processes(run_id)) == 5
    down = tfctl("down", "-f", str(cluster), home=home)
    assert down.returncode == 0, down.stderr
    assert f"5 processes stopped on 1 host; 0 remain; ports {number_ranges(ports)} free" in down.stderr
    assert run_processes(run_id) == []
    assert not any(port_listening(p) for p in ports)
    states = json.loads(tfctl("status", "--json", "-f", str(cluster), home=home).stdout)["tasks"]
    assert {t["state"] for t in states} == {"stopped"}
    again = tfctl("down", "-f", str(cluster), home=home)
    assert again.returncode == 0 and "0 processes stopped" in again.stderr  # idempotent
    # Logs stay readable after the run is gone.
    assert "w0 line 3" in tfctl("logs", "--run", run_id, home=home).stdout


def test_the_watcher_of_a_detached_run_is_the_process_that_started_it(tmp_path: Path, home: Path) -> None:
    """`up -d` forks its watcher before it connects: the tasks are started and later stopped over
    the same connections, by the recorded watcher, and no host is connected to a second time."""
    ports = free_ports(3)
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake("--name w --lines 1 --sleep $((1 - {task_index}))"),  # worker:1 ends before the chief
    )
    trace = tmp_path / "trace.jsonl"
    up = tfctl("--trace", str(trace), "-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    record = json.loads((home / "runs" / run_id / "run.json").read_text())
    watcher = record["watcher"]
    assert watcher["kind"] == "watcher"
    # The run recorded as over, then the watcher, which writes its last line after that, gone.
    wait_until(lambda: latest_state(home, run_id) != "running" and not is_same_process(watcher), 30, "the run's end")
    ended = json.loads((home / "runs" / run_id / "run.json").read_text())
    assert ended["state"] == "succeeded", ended
    assert run_processes(run_id) == []
    spans = [json.loads(line) for line in trace.read_text().splitlines()]
    talked = {d["pid"] for d in spans if d["event"].startswith(("agent.", "transport."))}
    assert talked == {watcher["pid"]}, spans
    assert [d["event"] for d in spans if d["event"] == "agent.info"] == ["agent.info"]
    assert {"agent.start", "agent.stop"} <= {d["event"] for d in spans}
    said = (home / "runs" / run_id / "watch.log").read_text()
    assert "worker:0 finished successfully; 2 tasks had ended; 1 process stopped" in said


def test_attached_up_ends_when_the_chief_worker_finishes(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake(
            f"--name w{{task_index}} --port $(({ports[1]} + {{task_index}} * {ports[2] - ports[1]})) "
            "--lines 2 --sleep $((3 - 2 * {task_index}))"
        ),
    )
    up = tfctl("up", "-f", str(cluster), home=home)
    assert up.returncode == 0, up.stderr
    assert "job succeeded" in up.stderr and "worker:0 finished successfully" in up.stderr
    out = up.stdout.splitlines()
    for task, who in (("ps:0", "ps"), ("worker:0", "w0"), ("worker:1", "w1")):
        assert any(line.startswith(f"[{task}]") and f"{who} line 1" in line for line in out), task
    assert "0 remain" in up.stderr and "free" in up.stderr
    run_id = latest_run(home)
    assert run_processes(run_id) == []
    assert not port_listening(ports[0])
    states = {
        t["task"]: t["state"] for t in json.loads(tfctl("status", "--json", "--run", run_id, home=home).stdout)["tasks"]
    }
    assert states == {"ps:0": "stopped", "worker:0": "succeeded", "worker:1": "succeeded"}


def test_attached_up_tells_its_notify_commands_the_run_succeeded(tmp_path: Path, home: Path) -> None:
    """The commands run on this machine, in the cluster file's directory, with the event on stdin
    and in TFCTL_EVENT_* variables."""
    ports = free_ports(2)
    notify = 'notify:\n  - cat >> events.jsonl\n  - echo "$TFCTL_EVENT_KIND $TFCTL_EVENT_RUN_ID" >> env.txt\n'
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake(f"--name w0 --port {ports[1]} --lines 1 --sleep 0.5"),
        extra=notify,
    )
    dry = tfctl("up", "--dry-run", "-f", str(cluster), home=home)
    assert "$ cat >> events.jsonl" in dry.stdout and not (tmp_path / "events.jsonl").exists()  # listed, not run
    up = tfctl("up", "-f", str(cluster), home=home)
    assert up.returncode == 0, up.stderr
    run_id = latest_run(home)
    (event,) = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert event["kind"] == "succeeded" and event["run_id"] == run_id and event["cluster"] == "t"
    assert event["reason"] == "worker:0 finished successfully" and event["cluster_file"] == str(cluster)
    assert (tmp_path / "env.txt").read_text() == f"succeeded {run_id}\n"
    assert "notify:" not in up.stderr  # nothing failed, nothing said

    # Detached, the run's watcher tells them.
    detached = tfctl("up", "-d", "-f", str(cluster), home=home)
    assert detached.returncode == 0, detached.stderr
    second = latest_run(home)
    wait_until(lambda: f"succeeded {second}" in (tmp_path / "env.txt").read_text(), 20, "the watcher's event")
    assert [json.loads(line)["run_id"] for line in (tmp_path / "events.jsonl").read_text().splitlines()] == [
        run_id,
        second,
    ]
    watcher = json.loads((home / "runs" / second / "run.json").read_text())["watcher"]["pid"]
    wait_until(lambda: not Path(f"/proc/{watcher}").exists(), 10, "the watcher's exit")  # nothing left running


def test_a_stalled_worker_is_restarted_by_its_monitor_and_the_run_goes_on_to_succeed(
    tmp_path: Path, home: Path
) -> None:
    """`on_stall: restart`, for real: the worker steps for half a second, then serves silently (30 s); its
    monitor stops it when asked and starts it again (its restart policy counts it), and the
    second run steps to its end."""
    (port,) = free_ports(1)
    first = fake(f"--name w --port {port} --lines 0 --steps-per-sec 5 --steps-for 0.5 --sleep 30")
    again = fake(f"--name w --port {port} --lines 0 --steps-per-sec 5 --sleep 1")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: t
grace_period: 2
startup_timeout: 20
progress: {{stall_timeout: 1, on_stall: restart}}
notify: [cat >> events.jsonl]
jobs:
  worker:
    hosts: [localhost:{port}]
    command: 'if [ -e restarted ]; then {again}; else touch restarted; {first}; fi'
    restart: {{policy: exit-code, max_restarts: 1, backoff: 0}}
""")
    up = tfctl("up", "-f", str(cluster), home=home)
    assert up.returncode == 0, up.stderr
    assert "restarting worker:0 (progress.on_stall: restart)" in up.stderr
    sent = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in sent] == ["stalled", "restarted", "succeeded"]
    assert "stalled: no step for" in sent[1]["reason"] and sent[1]["reason"].endswith("; restart 1 of 1")
    run_id = latest_run(home)
    (task,) = json.loads(tfctl("status", "--json", "--run", run_id, home=home).stdout)["tasks"]
    assert task["state"] == "succeeded" and task["restarts"] == 1
    assert run_processes(run_id) == []


def test_attached_up_fails_naming_the_failed_task(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    # worker 1 fails after 1 s; worker 0 would run for 30 s.
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake("--name w{task_index} --sleep $((30 - 29 * {task_index})) --exit {task_index}"),
    )
    began = time.monotonic()
    up = tfctl("up", "-f", str(cluster), home=home)
    assert up.returncode == 1
    assert "job failed" in up.stderr and "worker:1 on localhost exited with code 1" in up.stderr
    assert time.monotonic() - began < 25  # it did not wait for worker 0
    assert run_processes(latest_run(home)) == []


def test_second_live_run_is_refused(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    cluster = write_cluster(tmp_path, ports, fake(f"--name ps --port {ports[0]} --sleep -1"), fake("--sleep -1"))
    assert tfctl("up", "-d", "-f", str(cluster), home=home).returncode == 0
    try:
        second = tfctl("up", "-d", "-f", str(cluster), home=home)
        assert second.returncode == 2
        assert "still running" in second.stderr and "tfctl -f" in second.stderr and "down --run" in second.stderr
    finally:
        assert tfctl("down", "-f", str(cluster), home=home).returncode == 0


def test_ps_that_never_listens_times_out_and_nothing_stays(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    cluster = (
        write_cluster(
            tmp_path,
            ports,
            fake("--name ps --lines 2 --sleep -1"),
            fake("--sleep -1"),
        )
        .read_text()
        .replace("startup_timeout: 20", "startup_timeout: 1.5")
    )
    (tmp_path / "cluster.yaml").write_text(cluster)
    up = tfctl("up", "-f", str(tmp_path / "cluster.yaml"), home=home)
    assert up.returncode == 1
    assert f"ps:0 did not listen on localhost:{ports[0]} within 1.5s" in up.stderr
    assert "ps line 1" in up.stderr  # its last log lines are shown
    assert "Traceback" not in up.stderr
    assert run_processes(latest_run(home)) == []


def test_ports_in_use_are_reported_before_anything_starts(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    squatter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0', {ports[1]})); s.listen(); time.sleep(60)",
        ]
    )
    try:
        wait_until(lambda: port_listening(ports[1]), 10, "the squatter listening")
        cluster = write_cluster(tmp_path, ports, fake(f"--port {ports[0]} --sleep -1"), fake("--sleep -1"))
        up = tfctl("up", "-f", str(cluster), home=home)
        assert up.returncode == 1
        assert f"localhost:{ports[1]}: in use by pid {squatter.pid}" in up.stderr
        assert not port_listening(ports[0])  # the ps was never started
    finally:
        squatter.kill()
        squatter.wait()


def test_config_errors_exit_2_without_traceback(tmp_path: Path, home: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("name: x\ncomand: python t.py\njobs:\n  worker: [localhost:2222]\n")
    result = tfctl("up", "-f", str(bad), home=home)
    assert result.returncode == 2
    assert f"{bad}:2:1: comand: unknown key" in result.stderr and "command" in result.stderr
    assert "Traceback" not in result.stderr
    missing = tfctl("status", home=home, cwd=tmp_path / "..")
    assert missing.returncode == 2 and "no cluster.yaml" in missing.stderr


def test_dry_run_prints_tasks_and_starts_nothing(tmp_path: Path, home: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "name: d\ncommand: python train.py --job_name={job_name} --task_index={task_index} "
        "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts}\n"
        "jobs:\n  ps: [localhost:2222]\n  worker: [localhost:2223, localhost:2224]\n"
    )
    result = tfctl("up", "--dry-run", "-f", str(cluster), home=home)
    assert result.returncode == 0
    assert (
        "python train.py --job_name=worker --task_index=1 --ps_hosts=localhost:2222 "
        "--worker_hosts=localhost:2223,localhost:2224"
    ) in result.stdout
    assert '"task":{"type":"ps","index":0}' in result.stdout
    assert not (home / "runs").exists()


def test_logs_task_filter_rejects_unknown_names(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    cluster = write_cluster(tmp_path, ports, fake(f"--port {ports[0]} --sleep 0"), fake("--sleep 0"))
    tfctl("up", "-f", str(cluster), home=home)
    result = tfctl("logs", "--file", str(cluster), "chief", home=home)
    assert result.returncode == 2 and "no task 'chief'" in result.stderr and "worker:0" in result.stderr


def test_logs_dash_f_with_a_cluster_file_says_it_means_follow(tmp_path: Path, home: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: x\n")
    result = tfctl("logs", "-f", "cluster.yaml", home=home, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "`-f` after `logs` means --follow" in result.stderr
    assert "tfctl logs --file cluster.yaml -f" in result.stderr


@pytest.mark.parametrize("value, seconds", [("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("2d", 172800.0)])
def test_durations_read_as_docker_writes_them(value: str, seconds: float) -> None:
    from tfctl.cli.common import Duration

    assert Duration().convert(value, None, None) == seconds


def test_a_bad_since_is_a_usage_error(tmp_path: Path, home: Path) -> None:
    result = tfctl("logs", "--since", "5 minutes", home=home, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "'5 minutes' is not a duration: write e.g. 90s, 5m, 2h or 1h30m" in result.stderr


def test_logs_follow_streams_live_and_ends_with_the_run(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    cluster = write_cluster(
        tmp_path, ports, fake(f"--name ps --port {ports[0]} --sleep -1"), fake("--name w0 --lines 3 --sleep 3")
    )
    assert tfctl("up", "-d", "-f", str(cluster), home=home).returncode == 0
    follower = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "logs", "-f"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )
    assert follower.stdout is not None
    first = follower.stdout.readline()
    assert first.startswith("[")  # output arrives while the run is still going
    out = read_rest(follower, timeout=30)  # the watcher ends the run; follow ends by itself
    assert follower.returncode == 0
    assert "[worker:0] w0 done, exit 0" in first + out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_the_whole_cluster_at_once(tmp_path: Path, home: Path, signum: int) -> None:
    """SIGTERM (`kill`, `timeout`, a batch job's limit) is Ctrl-C: nothing waits for the lease."""
    ports = free_ports(3)
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake("--name w{task_index} --ignore-term --sleep -1"),
    )
    up = spawn_tfctl("up", "-f", str(cluster), home=home)
    assert up.stderr is not None
    wait_for_line(up.stderr, "following", 20)
    run_id = latest_run(home)
    assert len(run_processes(run_id)) == 3
    up.send_signal(signum)
    _, err = up.communicate(timeout=30)
    assert up.returncode == 130
    assert "stopping the cluster" in err and "0 remain" in err
    assert run_processes(run_id) == []


def test_down_all_reaps_orphans_of_dead_runs(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    cluster = write_cluster(tmp_path, ports, fake(f"--port {ports[0]} --sleep 0"), fake("--sleep 0"))
    from tfctl.runs.store import RunStore

    store = RunStore(home).store_id
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "TFCTL_RUN_ID": "crashed-run-1", "TFCTL_STORE": store},
        start_new_session=True,
    )
    try:
        result = tfctl("down", "--all", "-f", str(cluster), home=home)
        assert result.returncode == 0, result.stderr
        assert "crashed-run-1" in result.stderr
        orphan.wait(timeout=10)
    finally:
        orphan.kill()
        orphan.wait()


@pytest.mark.parametrize("argv", [["--help"], ["up", "--help"], ["logs", "--help"]])
def test_help_imports_neither_tensorflow_nor_paramiko(argv: list[str]) -> None:
    code = (
        "import sys, runpy; sys.argv = ['tfctl', *%r]\n"
        "try:\n    runpy.run_module('tfctl', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('tensorflow', 'paramiko', 'rich') if m in sys.modules))" % (argv,)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_check_names_a_busy_port_and_starts_nothing(tmp_path: Path, home: Path) -> None:
    ports = free_ports(2)
    cluster = write_cluster(tmp_path, ports, fake(f"--port {ports[0]} --sleep -1"), fake("--sleep -1"))
    ok = tfctl("check", "-f", str(cluster), home=home)
    assert ok.returncode == 0, ok.stderr
    assert "localhost" in ok.stdout and f"localhost:{ports[0]}: all 1 connections ok" in ok.stderr
    squatter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0', {ports[1]})); s.listen(); time.sleep(60)",
        ]
    )
    try:
        wait_until(lambda: port_listening(ports[1]), 10, "the squatter listening")
        busy = tfctl("check", "-f", str(cluster), home=home)
        assert busy.returncode == 1
        assert f"port in use: localhost:{ports[1]} (pid {squatter.pid}" in busy.stderr
    finally:
        squatter.kill()
        squatter.wait()
    assert not (home / "runs").exists()


def test_the_hosts_python_comes_first_on_the_tasks_path(tmp_path: Path, home: Path) -> None:
    """`python train.py` in a command means the configured interpreter, as in an activated venv."""
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name in ("python3", "python"):
        (venv_bin / name).symlink_to(sys.executable)
    (tmp_path / "show.py").write_text("import os\nprint('first on PATH:', os.environ['PATH'].split(os.pathsep)[0])\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: venv
hosts: {{localhost: {{python: {venv_bin / "python3"}}}}}
jobs:
  worker:
    hosts: [localhost:{free_ports(1)[0]}]
    command: python show.py
""")
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    assert f"first on PATH: {venv_bin}" in up.stdout
    assert f"ok: python {sys.version.split()[0]} ({venv_bin / 'python3'})" in up.stderr


# --- GPUs and cores per task ---------------------------------------------------------------------


def device_cluster(dirpath: Path, worker_keys: str, ps_keys: str = "") -> Path:
    """A ps and two workers that print their devices, then run until stopped."""
    ports = free_ports(3)
    show = fake("--name {job_name}{task_index} --devices --port -1 --sleep -1")
    path = dirpath / "cluster.yaml"
    path.write_text(f"""name: dev
grace_period: 2
startup_timeout: 20
command: "{show}"
env: {{ENV_GPUS: "{{gpus}}"}}
jobs:
  ps: {{hosts: [localhost:{ports[0]}]{ps_keys}}}
  worker: {{hosts: [localhost:{ports[1]}, localhost:{ports[2]}]{worker_keys}}}
""")
    return path


def with_gpus(dirpath: Path, count: int) -> dict[str, str]:
    """The environment of a tfctl whose localhost has `count` GPUs, as a stand-in nvidia-smi lists them."""
    bin_dir = dirpath / "gpu-bin"
    bin_dir.mkdir()
    listing = "".join(f"{i}, GPU-{i:08x}-stand-in\\n" for i in range(count))
    busy = "".join(f"{i}, {gpu_util(i):g}\\n" for i in range(count))
    # The monitors' usage queries too: GPU i is gpu_util(i) % busy; worker:1's processes hold 1 GiB.
    (bin_dir / "nvidia-smi").write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=index,utilization.gpu) printf '{busy}' ;;
  --query-compute-apps=pid,used_memory)
    for found in $(grep -lz '^TFCTL_TASK=worker:1$' /proc/[0-9]*/environ 2>/dev/null); do
      pid=${{found#/proc/}}; echo "${{pid%/environ}}, 1024"
    done ;;
  *) printf '{listing}' ;;
esac
""")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def gpu_util(index: int) -> float:
    """How busy the stand-in nvidia-smi says GPU `index` is."""
    return 10.0 + 20 * index


def devices_seen(cluster: Path, home: Path) -> dict[str, dict]:
    """task -> what it printed about its devices, once all three did (read with `tfctl logs`)."""

    def seen() -> dict[str, dict]:
        found = {}
        for line in tfctl("-f", str(cluster), "logs", home=home).stdout.splitlines():
            task, _, text = line.partition(" ")
            if text.strip().startswith("devices "):
                found[task.strip("[]")] = json.loads(text.strip().split(" ", 1)[1])
        return found

    return wait_until(seen, 20, "every task printing its devices", until=lambda found: len(found) >= 3, interval=0.2)


def test_each_worker_gets_its_own_gpus_and_the_ps_none(tmp_path: Path, home: Path) -> None:
    cluster = device_cluster(tmp_path, ", gpus: 2")
    env = with_gpus(tmp_path, 4)
    dry = tfctl("-f", str(cluster), "up", "--dry-run", home=home, env=env)
    assert "gpus:      CUDA_VISIBLE_DEVICES='2,3'" in dry.stdout
    up = tfctl("-f", str(cluster), "up", "-d", home=home, env=env)
    assert up.returncode == 0, up.stderr
    assert "4 GPUs" in up.stderr
    try:
        seen = devices_seen(cluster, home)
        assert {task: (s["cuda"], s["env_gpus"]) for task, s in seen.items()} == {
            "ps:0": ("", ""),
            "worker:0": ("0,1", "0,1"),
            "worker:1": ("2,3", "2,3"),
        }
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        assert [(t["task"], t["gpus"], t["cpus"]) for t in tasks] == [
            ("ps:0", [], None),
            ("worker:0", [0, 1], None),
            ("worker:1", [2, 3], None),
        ]
        table = tfctl("-f", str(cluster), "status", home=home, env={"COLUMNS": "200"}).stdout.splitlines()
        assert "GPUS" in table[1] and "CPUS" not in table[1]
        assert table[2].split()[table[1].split().index("GPUS")] == "none"
        assert table[4].split()[table[1].split().index("GPUS")] == "2,3"
    finally:
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0


def test_status_json_has_the_use_of_each_tasks_gpus_and_the_gpu_memory_its_processes_hold(
    tmp_path: Path, home: Path
) -> None:
    cluster = device_cluster(tmp_path, ", gpus: 2")
    up = tfctl("-f", str(cluster), "up", "-d", home=home, env=with_gpus(tmp_path, 4))
    assert up.returncode == 0, up.stderr
    try:
        tasks = wait_until(
            lambda: {
                t["task"]: t
                for t in json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
            },
            30,
            "a usage sample of every task",
            until=lambda found: all(t["rss_bytes"] for t in found.values()),
            interval=0.5,
        )
        assert tasks["worker:0"]["gpu_util_percent"] == (gpu_util(0) + gpu_util(1)) / 2
        assert tasks["worker:1"]["gpu_util_percent"] == (gpu_util(2) + gpu_util(3)) / 2
        assert (tasks["worker:0"]["gpu_memory_bytes"], tasks["worker:1"]["gpu_memory_bytes"]) == (0, 1 << 30)
        assert tasks["ps:0"]["gpu_util_percent"] is None and tasks["ps:0"]["gpu_memory_bytes"] is None  # no GPU
        screen = tfctl("-f", str(cluster), "top", "--once", home=home, env={"COLUMNS": "200"}).stdout
        assert "GPU MEM" in screen and "1.0 GiB" in screen
    finally:
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0


def test_each_worker_runs_on_its_own_cores(tmp_path: Path, home: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip(f"pinning two workers to a core each needs 2 cores; this process may use only {allowed}")
    cluster = device_cluster(tmp_path, ", cpus: 1")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    try:
        seen = devices_seen(cluster, home)
        assert [seen[t]["cores"] for t in ("worker:0", "worker:1")] == [str(allowed[0]), str(allowed[1])]
        assert seen["ps:0"]["cuda"] is None  # no task asked for GPUs: nothing is hidden
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        assert [t["cpus"] for t in tasks] == [None, [allowed[0]], [allowed[1]]]
    finally:
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0


def test_asking_for_more_gpus_than_a_host_has_starts_nothing(tmp_path: Path, home: Path) -> None:
    cluster = device_cluster(tmp_path, ", gpus: 3", ps_keys=", gpus: 0")
    up = tfctl("-f", str(cluster), "up", home=home, env=with_gpus(tmp_path, 4), timeout=30)
    assert up.returncode == 2, up.stderr
    assert "error: localhost has 4 GPUs; its tasks ask for 6: worker:0 3, worker:1 3" in up.stderr
    assert "hint: lower `gpus` of job worker, or move some of those tasks to another host" in up.stderr
    assert "Traceback" not in up.stderr and "starting on" not in up.stderr
    assert json.loads(tfctl("runs", "--json", home=home).stdout) == []
    assert not marked_processes()


def test_a_host_without_nvidia_smi_has_no_gpu_to_give(tmp_path: Path, home: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an nvidia-smi; the test needs a host without one")
    cluster = device_cluster(tmp_path, ", gpus: 1")
    up = tfctl("-f", str(cluster), "up", home=home, timeout=30)
    assert up.returncode == 2, up.stderr
    assert "localhost has 0 GPUs (nvidia-smi not found on PATH); its tasks ask for 2" in up.stderr
    assert "install the NVIDIA driver on localhost" in up.stderr and "starting on" not in up.stderr
    assert json.loads(tfctl("runs", "--json", home=home).stdout) == []
