"""`tracking: {mlflow: ...}` against a real MLflow server on loopback: one MLflow run per tfctl run,
the chief's own metrics in it, tfctl's figures and the report attached, the same run across
`down` and `up --resume`, a sweep nested in one parent, and a server that stops answering costing
one line and never the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import marked_processes, no_warnings, tfctl
from tests.mlflow_server import MlflowServer, free_port, needs_mlflow

pytestmark = needs_mlflow

# Listens on its port as a TF server would, prints what it was told of its tracker, then
# training-like lines; with --log the chief logs its own loss through the mlflow library, which
# finds the run from MLFLOW_RUN_ID alone.
PROGRAM = """\
import json, os, socket, sys, time
tf = json.loads(os.environ["TF_CONFIG"])
server = socket.create_server(("", int(tf["cluster"][tf["task"]["type"]][tf["task"]["index"]].rsplit(":", 1)[1])))
told = {k: v for k, v in os.environ.items() if k.startswith(("MLFLOW_", "TFCTL_CHIEF"))}
print("told " + json.dumps(told, sort_keys=True), flush=True)
steps, pause, log = int(sys.argv[1]), float(sys.argv[2]), "--log" in sys.argv
chief = os.environ.get("TFCTL_CHIEF") == "1"
if log and chief:
    import mlflow
    mlflow.start_run()
for step in range(1, steps + 1):
    loss = 1.0 / step
    print(f"step {step * 10}: loss {loss:.4f} accuracy {0.5 + step / (4 * steps):.4f}", flush=True)
    if log and chief:
        mlflow.log_metric("chief_loss", loss, step=step * 10)
    time.sleep(pause)
if log and chief:
    mlflow.end_run()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with MlflowServer(tmp_path_factory.mktemp("mlflow")) as running:
        yield running


def cluster_file(tmp_path: Path, uri: str, experiment: str, args: str = "4 0.1", extra: str = "") -> Path:
    (tmp_path / "train.py").write_text(PROGRAM)
    path = tmp_path / "cluster.yaml"
    path.write_text(f"""name: tracked
workdir: {tmp_path}
command: "{{python}} train.py {args}"
params: {{lr: 0.1}}
grace_period: 3
jobs:
  worker: [localhost, localhost]
tracking:
  mlflow: {{uri: "{uri}", experiment: {experiment}}}
{extra}""")
    return path


def told(stdout: str) -> dict[str, dict[str, str]]:
    """task -> the tracker variables it printed."""
    out = {}
    for line in stdout.splitlines():
        task, _, rest = line.partition("] told ")
        if rest:
            out[task.lstrip("[")] = json.loads(rest)
    return out


def newest(home: Path) -> dict:
    return json.loads(tfctl("runs", "--json", home=home).stdout)[-1]


def test_a_run_is_one_mlflow_run_with_the_chiefs_metrics_tfctls_figures_and_the_report(
    tmp_path: Path, home: Path, server: MlflowServer
) -> None:
    cluster = cluster_file(tmp_path, server.uri, "one-run", "5 0.2 --log")
    up = tfctl("-f", str(cluster), "up", home=home, timeout=180)
    assert up.returncode == 0, up.stderr + up.stdout[-2000:]
    no_warnings(up.stderr)
    run = newest(home)
    (mine,) = server.runs("one-run")
    assert run["tracking"] == [
        {
            "tracker": "mlflow",
            "run_id": mine["id"],
            "url": f"{server.uri}/#/experiments/{mine['experiment_id']}/runs/{mine['id']}",
            "missed": [],
        }
    ]
    assert run["tracking"][0]["url"] in up.stderr  # said as the run starts
    env = told(up.stdout)
    assert env["worker:0"]["MLFLOW_RUN_ID"] == env["worker:1"]["MLFLOW_RUN_ID"] == mine["id"]
    assert env["worker:0"]["MLFLOW_TRACKING_URI"] == server.uri
    assert (env["worker:0"]["TFCTL_CHIEF"], env["worker:1"]["TFCTL_CHIEF"]) == ("1", "0")
    assert mine["status"] == "FINISHED"
    assert mine["tags"]["tfctl.run_id"] == run["run_id"] and mine["tags"]["tfctl.state"] == "succeeded"
    assert mine["params"] == {"lr": "0.1", "tfctl.worker": "2"}
    # The chief's own logging went into the run tfctl made, not a run of its own.
    assert server.history(mine["id"], "chief_loss") == [(10 * s, pytest.approx(1 / s)) for s in range(1, 6)]
    assert server.history(mine["id"], "tfctl/loss") == [(10 * s, pytest.approx(1 / s, abs=1e-4)) for s in range(1, 6)]
    assert mine["metrics"]["tfctl/wall_seconds"] == run["accounting"]["total"]["wall_seconds"]
    assert "tfctl-report.html" in server.artifacts(mine["id"])
    status = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)
    assert status["run"]["tracking"] == run["tracking"]
    page = tfctl("-f", str(cluster), "report", "-o", "-", home=home).stdout
    assert f"mlflow {run['tracking'][0]['url']}" in page
    assert not [pid for pid, (_, r) in marked_processes().items() if r == run["run_id"]]


def test_down_and_resume_go_on_in_the_same_mlflow_run(tmp_path: Path, home: Path, server: MlflowServer) -> None:
    cluster = cluster_file(tmp_path, server.uri, "resumed", "400 0.1")
    first = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert first.returncode == 0, first.stderr
    wait_until(lambda: server.runs("resumed"), 30, "the MLflow run made")
    (made,) = server.runs("resumed")
    assert made["status"] == "RUNNING"
    down = tfctl("-f", str(cluster), "down", home=home, timeout=60)
    assert down.returncode == 0, down.stderr
    (stopped,) = server.runs("resumed")
    assert stopped["status"] == "KILLED" and stopped["tags"]["tfctl.state"] == "stopped"
    earlier = newest(home)["run_id"]
    cluster.write_text(cluster.read_text().replace("400 0.1", "3 0.1"))
    again = tfctl("-f", str(cluster), "up", "--resume", home=home, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"MLflow: goes on in run {newest(home)['tracking'][0]['url']}" in again.stderr
    (same,) = server.runs("resumed")  # no second run
    assert same["id"] == made["id"] and same["status"] == "FINISHED"
    assert same["tags"]["tfctl.run_id"] == earlier and same["tags"]["tfctl.latest_run"] == newest(home)["run_id"]
    assert {v["MLFLOW_RUN_ID"] for v in told(again.stdout).values()} == {made["id"]}


def test_a_server_that_stops_answering_mid_run_costs_one_line_and_not_the_run(
    tmp_path: Path, home: Path, server: MlflowServer
) -> None:
    cluster = cluster_file(tmp_path, server.uri, "frozen", "30 0.1")
    first = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert first.returncode == 0, first.stderr
    run_id = newest(home)["run_id"]
    server.freeze(True)
    try:
        ended = wait_until(lambda: newest(home), 90, "the run's end", until=lambda r: r["state"] != "running")
        ended = wait_until(lambda: newest(home), 30, "its trackers told", until=lambda r: r["tracking"][0]["missed"])
    finally:
        server.freeze(False)
    assert ended["state"] == "succeeded"
    (missed,) = ended["tracking"][0]["missed"]
    assert missed.startswith("the run's end, tfctl's figures and the report (MLflow at") and "did not answer" in missed
    log = (home / "runs" / run_id / "watch.log").read_text()
    assert [line for line in log.splitlines() if line.startswith("tracking:")] == [
        f"tracking: MLflow run {ended['tracking'][0]['url']} was not given {missed}"
    ]
    status = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)
    assert status["run"]["tracking"][0]["missed"] == [missed]


def test_a_server_down_at_start_costs_one_warning_and_the_run_goes_on_without_one(tmp_path: Path, home: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    cluster = cluster_file(tmp_path, nowhere, "never")
    up = tfctl("-f", str(cluster), "up", home=home, timeout=120)
    assert up.returncode == 0, up.stderr
    warnings = [line for line in up.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1 and f"tracking: MLflow at {nowhere} did not answer" in warnings[0]
    assert "the run goes on without one" in warnings[0]
    assert newest(home)["tracking"] == [] and newest(home)["state"] == "succeeded"
    assert {k for v in told(up.stdout).values() for k in v} == {"TFCTL_CHIEF"}


def test_a_sweeps_trials_are_children_of_one_parent_run(tmp_path: Path, home: Path, server: MlflowServer) -> None:
    cluster = cluster_file(
        tmp_path, server.uri, "swept", extra="sweep: {grid: {lr: [0.1, 0.2, 0.3]}, max_parallel: 3}\n"
    )
    swept = tfctl("-f", str(cluster), "sweep", home=home, timeout=240)
    assert swept.returncode == 0, swept.stderr + swept.stdout
    runs = server.runs("swept")
    parents = [r for r in runs if "tfctl.sweep" in r["tags"]]
    assert len(parents) == 1 and parents[0]["status"] == "FINISHED"
    children = [r for r in runs if r not in parents]
    assert len(children) == 3
    assert {r["tags"]["mlflow.parentRunId"] for r in children} == {parents[0]["id"]}
    assert sorted(r["params"]["lr"] for r in children) == ["0.1", "0.2", "0.3"]
    assert all(r["status"] == "FINISHED" for r in children)
    assert f"MLflow: sweep run {server.uri}/#/experiments/" in swept.stderr
