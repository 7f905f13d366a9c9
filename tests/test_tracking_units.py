"""The decisions of `tracking:` as tables: what the cluster file may say, what each task is told
(and which task is the chief), that a move keeps it, and how a tracker's answers are read."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import tfctl
from tfctl.config.loader import parse_config
from tfctl.errors import ConfigError, TrackingError
from tfctl.runs.record import TaskSpec, TrackerRun
from tfctl.tf.moves import readdressed
from tfctl.tf.tasks import plan_tasks
from tfctl.tracking import registry
from tfctl.tracking.http import Refused, auth_headers
from tfctl.tracking.mlflow import Mlflow, _proxied
from tfctl.tracking.trackers import Opening
from tfctl.tracking.wandb import Wandb, wandb_id

BASE = "name: m\ncommand: python t.py\njobs: {ps: [h1:2222], worker: [h1:2223, h2:2222]}\n"
MLFLOW = "tracking: {mlflow: {uri: 'http://127.0.0.1:5000'}}\n"

REFUSED = [
    ("tracking: {}\n", "tracking", "names no tracker"),
    ("tracking: {mlflow: {experiment: x}}\n", "tracking.mlflow.uri", "missing required key `uri`"),
    ("tracking: {mlflow: {uri: 127.0.0.1:5000}}\n", "tracking.mlflow.uri", "not an http(s) address"),
    ("tracking: {mlflow: {uri: http://h:1, experimnt: x}}\n", "tracking.mlflow.experimnt", "unknown key"),
    ("tracking: {wandb: {project: p, mode: off}}\n", "tracking.wandb.mode", "expected one of online"),
    ("tracking: {wandb: {entity: e}}\n", "tracking.wandb.project", "missing required key `project`"),
    ("tracking: {comet: {}}\n", "tracking.comet", "unknown key"),
    ("tracking: {mlflow: {uri: 'http://ann:pw@h:5000'}}\n", "tracking.mlflow.uri", "names a user or password"),
    (MLFLOW + "env: {MLFLOW_RUN_ID: x}\n", "env.MLFLOW_RUN_ID", "set by tfctl while `tracking:` is on"),
    (MLFLOW + "env: {TFCTL_CHIEF: '1'}\n", "env.TFCTL_CHIEF", "set by tfctl while `tracking:` is on"),
]


@pytest.mark.parametrize("extra, path, said", REFUSED, ids=[r[1] + ": " + r[2] for r in REFUSED])
def test_a_wrong_tracking_section_is_refused_with_its_key(extra: str, path: str, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(BASE + extra, Path("c.yaml"))
    assert [(p.key_path, said in p.message) for p in raised.value.problems] == [(path, True)]


def test_without_tracking_the_users_env_may_name_a_trackers_variables() -> None:
    config = parse_config(BASE + "env: {MLFLOW_RUN_ID: mine}\n", Path("c.yaml"))
    assert config.tracking is None and config.env["MLFLOW_RUN_ID"] == "mine"


LINK = TrackerRun("mlflow", "r9", uri="http://127.0.0.1:5000", experiment="m", experiment_id="3")


def plan(text: str, links: tuple[TrackerRun, ...]) -> list[TaskSpec]:
    config = parse_config(text, Path("c.yaml"))
    hosts = {"h1": "py", "h2": "py"}
    return plan_tasks(config, "run-1", hosts, {"h1": "/w", "h2": "/w"}, None, registry.task_env(links))


def planned(text: str, links: tuple[TrackerRun, ...]) -> dict[str, dict[str, str]]:
    return {t.name: t.env for t in plan(text, links)}


CHIEFS = [
    ("no chief job: worker 0", BASE, {"ps:0": "0", "worker:0": "1", "worker:1": "0"}),
    (
        "a chief job: the chief",
        "name: m\ncommand: python t.py\njobs: {chief: [h1:2224], worker: [h1:2223, h2:2222]}\n",
        {"chief:0": "1", "worker:0": "0", "worker:1": "0"},
    ),
]


@pytest.mark.parametrize("text, chief", [c[1:] for c in CHIEFS], ids=[c[0] for c in CHIEFS])
def test_every_task_is_told_the_run_and_only_the_chief_that_it_logs(text: str, chief: dict[str, str]) -> None:
    env = planned(text + MLFLOW, (LINK,))
    assert {name: e["TFCTL_CHIEF"] for name, e in env.items()} == chief
    told = {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "MLFLOW_RUN_ID": "r9",
        "MLFLOW_EXPERIMENT_NAME": "m",
        "MLFLOW_EXPERIMENT_ID": "3",
    }
    assert all({k: e[k] for k in told} == told for e in env.values())


def test_without_tracking_no_task_is_told_anything_of_it() -> None:
    env = planned(BASE, ())
    assert not [k for e in env.values() for k in e if k.startswith(("MLFLOW_", "WANDB_", "TFCTL_CHIEF"))]


def test_a_tracker_that_refused_at_start_leaves_the_tasks_only_the_chiefs_flag() -> None:
    env = planned(BASE + MLFLOW, ())
    assert {k for e in env.values() for k in e if k.startswith(("MLFLOW_", "TFCTL_CHIEF"))} == {"TFCTL_CHIEF"}


def test_a_task_moved_to_a_spare_keeps_its_tracker_run() -> None:
    task = next(t for t in plan(BASE + MLFLOW, (LINK,)) if t.name == "worker:1")
    moved = readdressed(task, {"h2:2222": "h3:2222"})
    assert "h3:2222" in moved.env["TF_CONFIG"]
    told = ("MLFLOW_", "TFCTL_CHIEF")
    assert {k: v for k, v in moved.env.items() if k.startswith(told)} == {
        k: v for k, v in task.env.items() if k.startswith(told)
    }


def test_a_wandb_run_is_named_by_the_first_tfctl_run_and_grouped_by_its_sweep() -> None:
    tracker = Wandb("proj", "team", "offline")
    link = tracker.open(Opening("mnist-2026 12/x", "mnist", "ssh", "ann", "c", 0.0, group="mnist-sweep-1"))
    assert (link.run_id, link.group, link.url) == ("mnist-2026-12-x", "mnist-sweep-1", "")  # offline: no page
    env = tracker.task_env(link)
    assert env == {
        "WANDB_RUN_ID": "mnist-2026-12-x",
        "WANDB_RESUME": "allow",
        "WANDB_PROJECT": "proj",
        "WANDB_NAME": "mnist-2026-12-x",
        "WANDB_RUN_GROUP": "mnist-sweep-1",
        "WANDB_ENTITY": "team",
        "WANDB_MODE": "offline",
    }
    online = Wandb("proj", "team", None).open(Opening("r1", "mnist", "ssh", "ann", "c", 0.0))
    assert online.url == "https://wandb.ai/team/proj/runs/r1" and online.group == "mnist"


PROXIED = [
    ("mlflow-artifacts:/1/abc/artifacts", "1/abc/artifacts"),
    ("mlflow-artifacts://10.0.0.1:5000/1/abc/artifacts", "1/abc/artifacts"),
    ("s3://bucket/1/abc/artifacts", None),
    ("file:///srv/mlruns/1/abc/artifacts", None),
    ("", None),
]


@pytest.mark.parametrize("location, path", PROXIED, ids=[p[0] or "none" for p in PROXIED])
def test_the_report_goes_up_only_through_the_servers_artifact_proxy(location: str, path: str | None) -> None:
    assert _proxied(location) == path


AUTH = [
    ({}, {}),
    ({"MLFLOW_TRACKING_TOKEN": "t0k"}, {"Authorization": "Bearer t0k"}),
    ({"MLFLOW_TRACKING_USERNAME": "ann", "MLFLOW_TRACKING_PASSWORD": "pw"}, {"Authorization": "Basic YW5uOnB3"}),
    ({"MLFLOW_TRACKING_USERNAME": "ann"}, {}),
]


@pytest.mark.parametrize("env, headers", AUTH)
def test_credentials_come_from_mlflows_own_variables(env: dict[str, str], headers: dict[str, str]) -> None:
    assert auth_headers(env) == headers


def test_a_refusal_says_the_servers_own_words() -> None:
    said = Refused("MLflow at http://h", "/api/2.0/mlflow/runs/create", 400, b'{"error_code": "X", "message": "no"}')
    assert (said.code, said.status, said.message) == (
        "X",
        400,
        "MLflow at http://h refused /api/2.0/mlflow/runs/create: no",
    )
    plain = Refused("MLflow at http://h", "/p", 502, b"<html>Bad Gateway</html>")
    assert plain.code == "" and plain.message.endswith("<html>Bad Gateway</html>")


SYSTEM_PYTHON = Path("/usr/bin/python3")


def _has_tensorboard(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import tensorboard"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not SYSTEM_PYTHON.exists() or _has_tensorboard(SYSTEM_PYTHON), reason="needs a /usr/bin/python3 without tensorboard"
)
def test_a_logdir_no_tensorboard_could_show_is_said_before_anything_starts(tmp_path: Path, home: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: tb
command: "{{python}} -c 'pass'"
python: {SYSTEM_PYTHON}
logdir: logs/{{run_id}}
jobs:
  worker: [localhost]
""")
    said = f"localhost: {SYSTEM_PYTHON} has no tensorboard, so `tfctl tensorboard` cannot show the summaries"
    check = tfctl("-f", str(cluster), "check", "--json", home=home)
    assert check.returncode == 0, check.stderr
    assert [w for w in json.loads(check.stdout)["warnings"] if said in w] != []
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0 and said in up.stderr, up.stderr  # said, and the run goes on
    assert f"{SYSTEM_PYTHON} -m pip install tensorboard" in up.stderr


def test_a_long_run_id_keeps_a_w_and_b_id_of_its_own() -> None:
    one, two = "c" * 60 + "-20261204-120000-aaaa", "c" * 60 + "-20261204-120000-bbbb"
    assert len(wandb_id(one)) == 64 and wandb_id(one) != wandb_id(two)
    assert wandb_id("mnist-20261204-120000-aaaa") == "mnist-20261204-120000-aaaa"


class _Answering:
    """A loopback server that answers every request with `reply` (raw bytes), then closes."""

    def __init__(self, reply: bytes) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.uri = f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.reply)

    def close(self) -> None:
        self.server.close()


ODD_ANSWERS = [
    (b"SSH-2.0-OpenSSH_9.2\r\n", "did not answer"),  # not HTTP at all: a wrong port
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]", "without the experiment's id"),
    (b'HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n{"experiment": 1}', "without the experiment's id"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n<html", "something not JSON"),
]


@pytest.mark.parametrize("reply, said", ODD_ANSWERS, ids=["not http", "a list", "a number", "not json"])
def test_an_odd_answer_is_a_trackers_failure_never_another_error(reply: bytes, said: str) -> None:
    server = _Answering(reply)
    try:
        with pytest.raises(TrackingError, match=said):
            Mlflow(server.uri, "e").open(Opening("r1", "c", "ssh", "ann", "cmd", 0.0))
    finally:
        server.close()
