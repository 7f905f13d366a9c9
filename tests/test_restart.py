"""Restart policies: a task that ends is started again on its host, as Kubeflow's TFJob does."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import fake, free_ports, tfctl
from tests.test_cli_localhost import latest_run, write_cluster
from tfctl.cluster.agent import HostAgent
from tfctl.config.loader import load_config
from tfctl.controller.start.plan import draft, make_plan
from tfctl.errors import ConfigError
from tfctl.runs.record import ProgressSpec, RestartSpec, RunRecord
from tfctl.supervisor.protocol import (
    RestartRequest,
    RestartRule,
    StartRequest,
    StatusRequest,
    StopRequest,
    TaskInfo,
    TaskLaunch,
    TaskState,
)
from tfctl.transport.local import LocalTransport


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[HostAgent]:
    with HostAgent(LocalTransport(), None, str(tmp_path / "host")) as agent:
        yield agent


def once_then(first: str, then: str, marker: Path) -> str:
    """A shell command that runs `first` on its first run and `then` on every later one."""
    m = shlex.quote(str(marker))
    return f"if [ -e {m} ]; then {then}; else touch {m}; {first}; fi"


def wait_state(agent: HostAgent, run: str, states: tuple[TaskState, ...], timeout: float = 20) -> TaskInfo:
    return wait_until(
        lambda: agent.call(StatusRequest(run, {"worker:1": 0})).tasks["worker:1"],
        timeout,
        f"worker:1 of {run} in {[s.value for s in states]}",
        until=lambda info: info.state in states,
    )


def start(agent: HostAgent, run: str, command: str, rule: RestartRule) -> None:
    agent.call(StartRequest(run, [TaskLaunch("worker:1", command, grace=1, restart=rule)]))


def test_on_failure_restarts_up_to_max_restarts_then_fails_with_every_exit(agent: HostAgent, tmp_path: Path) -> None:
    start(agent, "r", "echo run; exit 3", RestartRule("on-failure", 2, 0.2))
    info = wait_state(agent, "r", (TaskState.FAILED,))
    assert (info.exit_code, info.restarts, info.earlier_ends) == (3, 2, ["exited with code 3"] * 2)
    log = (next((tmp_path / "host").rglob("output.log"))).read_text().splitlines()
    assert log.count("run") == 3
    assert [line for line in log if line.startswith("tfctl:")] == [
        "tfctl: worker:1 exited with code 3; restart 1 of 2 in 0.2s",
        "tfctl: worker:1 exited with code 3; restart 2 of 2 in 0.2s",
    ]


def test_exit_code_policy_retries_signals_but_not_the_programs_own_verdict(agent: HostAgent, tmp_path: Path) -> None:
    start(agent, "killed", once_then("kill -9 $$", "exit 0", tmp_path / "m1"), RestartRule("exit-code", 3, 0.1))
    info = wait_state(agent, "killed", (TaskState.SUCCEEDED, TaskState.FAILED))
    assert (info.state, info.restarts, info.earlier_ends) == (TaskState.SUCCEEDED, 1, ["was killed by signal 9"])
    start(agent, "verdict", once_then("exit 1", "exit 0", tmp_path / "m2"), RestartRule("exit-code", 3, 0.1))
    info = wait_state(agent, "verdict", (TaskState.SUCCEEDED, TaskState.FAILED))
    assert (info.state, info.exit_code, info.restarts) == (TaskState.FAILED, 1, 0)


def test_a_task_stopped_while_it_waits_to_restart_stays_stopped(agent: HostAgent) -> None:
    start(agent, "r", "exit 1", RestartRule("on-failure", 5, 30))
    assert wait_state(agent, "r", (TaskState.RESTARTING,)).restarts == 1
    began = time.monotonic()
    stopped = agent.call(StopRequest("r", 1.0)).tasks["worker:1"]
    assert time.monotonic() - began < 5  # not the 30 s backoff
    assert (stopped.state, stopped.restarts) == (TaskState.STOPPED, 1)


def test_a_restart_the_controller_asks_for_counts_against_max_restarts(agent: HostAgent, tmp_path: Path) -> None:
    """`progress.on_stall: restart`: the monitor stops its running task and starts it again,
    whatever its policy says of the exit, recording the controller's reason as that end."""
    start(agent, "r", "echo run; exec sleep 60", RestartRule("exit-code", 1, 0))
    wait_state(agent, "r", (TaskState.RUNNING,))
    why = "stalled: no step for 200s (progress.stall_timeout 120s)"
    assert agent.call(RestartRequest("r", ["worker:1", "worker:9"], why)).asked == ["worker:1"]  # 9: never started
    info = wait_until(
        lambda: agent.call(StatusRequest("r", {"worker:1": 0})).tasks["worker:1"],
        20,
        "worker:1 running again",
        until=lambda i: i.restarts == 1 and i.state is TaskState.RUNNING,
    )
    assert info.earlier_ends == [why]
    assert agent.call(RestartRequest("r", ["worker:1"], why)).asked == ["worker:1"]  # its one restart is used up
    info = wait_state(agent, "r", (TaskState.FAILED, TaskState.SUCCEEDED))
    assert (info.state, info.signal, info.restarts) == (TaskState.FAILED, 15, 1)
    log = (next((tmp_path / "host").rglob("output.log"))).read_text().splitlines()
    assert log == ["run", f"tfctl: worker:1 {why}; restart 1 of 1 in 0s", "run"]


def test_an_attached_run_whose_worker_dies_once_succeeds_after_its_restart(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    marker = tmp_path / "died-once-{task_index}"  # each worker's own
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        "PLACEHOLDER",
        extra="success_policy: all_workers",
    )
    worker = fake(f"--name w{{task_index}} --port $(({ports[1]} + {{task_index}} * {ports[2] - ports[1]})) --sleep 3")
    dies_once = once_then("kill -9 $$", f"exec {worker}", marker)
    text = cluster.read_text().replace(
        '    command: "PLACEHOLDER"',
        f"    command: {json.dumps(dies_once)}\n    restart: {{policy: on-failure, max_restarts: 1, backoff: 0.5}}",
    )
    cluster.write_text(text)
    up = tfctl("up", "-f", str(cluster), home=home)
    assert up.returncode == 0, up.stderr + up.stdout
    assert "restart 1 of 1" in up.stdout
    tasks = {
        t["task"]: t
        for t in json.loads(tfctl("status", "--json", "--run", latest_run(home), home=home).stdout)["tasks"]
    }
    restarts = {name: (t["state"], t["restarts"]) for name, t in tasks.items()}
    assert "succeeded (1x restarted)" in tfctl("status", "--run", latest_run(home), home=home).stdout
    assert restarts == {"ps:0": ("stopped", 0), "worker:0": ("succeeded", 1), "worker:1": ("succeeded", 1)}


@pytest.mark.parametrize(
    ("restart", "message"),
    [
        ("{policy: always}", "jobs.worker.restart.policy: expected one of never, on-failure, exit-code"),
        ("{max_restarts: -1}", "jobs.worker.restart.max_restarts: must be a whole number, 0 or more"),
        ("{backoff: soon}", "jobs.worker.restart.backoff: expected a number of seconds"),
        ("{tries: 3}", "jobs.worker.restart.tries: unknown key"),
    ],
)
def test_a_wrong_restart_policy_is_a_config_error_naming_the_key(tmp_path: Path, restart: str, message: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"name: t\ncommand: x\njobs:\n  worker:\n    hosts: [localhost:2222]\n    restart: {restart}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert any(message in f"{p.key_path}: {p.message}" for p in raised.value.problems), raised.value.problems


def test_restart_defaults(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: t\ncommand: x\njobs:\n  worker:\n    hosts: [localhost:2222]\n    restart: {}\n")
    job = load_config(path).jobs["worker"]
    assert job.restart is not None and (job.restart.policy, job.restart.max_restarts, job.restart.backoff) == (
        "on-failure",
        3,
        10.0,
    )


def test_a_planned_run_keeps_restart_and_progress_settings_as_typed_records(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "name: t\ncommand: x\nprogress: {regex: 'it (?P<step>\\d+)', stall_timeout: 30}\njobs:\n"
        "  ps: {hosts: [localhost:2222], restart: {policy: never}}\n"
        "  worker: {hosts: [localhost:2223], restart: {policy: exit-code, max_restarts: 2, backoff: 0.5}}\n"
    )
    record = make_plan(draft(load_config(path), "t-20260101-000000-0000")).record
    stored = RunRecord.from_json(json.loads(json.dumps(record.to_json())))
    for r in (record, stored):
        assert r.task("ps:0").restart is None  # `never` is kept as no policy at all
        assert r.task("worker:0").restart == RestartSpec("exit-code", 2, 0.5)
        assert r.progress == ProgressSpec(r"it (?P<step>\d+)", 30.0, 60.0)
    assert stored == record
    worker = stored.task("worker:0").restart
    assert worker is not None and worker.rule() == RestartRule("exit-code", 2, 0.5)  # what its host is told
