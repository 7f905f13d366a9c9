"""`tracking:` on the simulated SSH hosts, with real TensorFlow: the examples' MNIST program and
the parameter-server template log from their chief into the MLflow run tfctl made (the server on
the lab's bridge, where every host reaches it), beside tfctl's own figures and the report; a
`down` and `up --resume` of the template go on in that one run from its checkpoint."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Iterator

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests.conftest import REPO, tfctl
from tests.mlflow_server import MlflowServer, needs_mlflow
from tests.test_ssh_cluster import run_pids, write_cluster
from tests.test_templates import copy_template

pytestmark = [
    pytest.mark.netns,
    pytest.mark.tf,
    needs_mlflow,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHostLab]:
    require_netns()
    with TestHostLab(
        3, workdir=tmp_path_factory.mktemp("tracking-lab"), prefix="tfctl-tk", bridge="tfctlbr83", subnet="10.77.83"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def server(lab: TestHostLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with MlflowServer(tmp_path_factory.mktemp("mlflow-lab"), host=lab.gateway) as running:
        yield running


def tracking(uri: str, experiment: str) -> str:
    return f'tracking: {{mlflow: {{uri: "{uri}", experiment: {experiment}}}}}'


def one_run(server: MlflowServer, experiment: str, home: Path) -> dict:
    """The experiment's one run, checked against the tfctl run that made it."""
    (made,) = server.runs(experiment)
    record = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]
    assert record["tracking"][0]["run_id"] == made["id"] and made["tags"]["tfctl.run_id"] == record["run_id"]
    assert made["status"] == "FINISHED" and made["tags"]["tfctl.state"] == "succeeded"
    assert "tfctl-report.html" in server.artifacts(made["id"])
    assert made["metrics"]["tfctl/wall_seconds"] > 0
    return made


def test_the_mnist_examples_chief_logs_into_the_run_tfctl_made(
    tmp_path: Path, home: Path, lab: TestHostLab, server: MlflowServer
) -> None:
    command = (
        "{python} train.py --job_name={job_name} --task_index={task_index} "
        "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --train_steps 2000"
    )
    jobs = "  ps: [tfh0:2222]\n  worker: [tfh1:2222, tfh2:2222]"
    extra = tracking(server.uri, "mnist-ssh")
    cluster = write_cluster(tmp_path, lab, jobs, command, extra=extra, workdir=REPO / "examples" / "mnist", name="mn")
    up = tfctl("-f", str(cluster), "up", home=home, timeout=300)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    made = one_run(server, "mnist-ssh", home)
    accuracy = float(up.stdout.split("final test accuracy ")[1].split()[0])
    assert made["metrics"]["test_accuracy"] == pytest.approx(accuracy, abs=1e-4)
    losses = server.history(made["id"], "loss")  # the chief's own, one point per progress line it printed
    printed = re.findall(r"^\[worker:0\]\s+step (\d+) worker 0 loss ([\d.]+)", up.stdout, re.M)
    assert [(step, round(v, 4)) for step, v in losses] == [(int(s), float(v)) for s, v in printed]
    assert made["params"]["tfctl.ps"] == "1" and made["params"]["tfctl.worker"] == "2"
    assert run_pids(lab, made["tags"]["tfctl.run_id"]) == {}


def test_the_parameter_server_templates_chief_logs_loss_and_accuracy(
    tmp_path: Path, home: Path, lab: TestHostLab, server: MlflowServer
) -> None:
    template = copy_template("parameter-server", tmp_path, train_steps=300)
    command = re.search(r"command: >-\n((?:  .*\n)+)", template.read_text())
    assert command is not None
    jobs = "  ps: [tfh0:2222]\n  chief: [tfh0:2223]\n  worker: [tfh1:2222, tfh2:2222]"
    extra = tracking(server.uri, "ps-template") + "\nlogdir: logs/{run_id}"
    line = " ".join(command.group(1).split())
    cluster = write_cluster(tmp_path, lab, jobs, line, extra=extra, workdir=template.parent, name="pst")
    up = tfctl("-f", str(cluster), "up", home=home, timeout=300)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    made = one_run(server, "ps-template", home)
    final = re.search(r"^\[chief:0\]\s+final step (\d+) loss \S+ accuracy ([\d.]+)", up.stdout, re.M)
    assert final is not None
    assert made["metrics"]["test_accuracy"] == pytest.approx(float(final.group(2)), abs=1e-4)
    assert [step for step, _ in server.history(made["id"], "loss")][:3] == [100, 200, 300]
    assert server.history(made["id"], "steps_per_sec")
    assert run_pids(lab, made["tags"]["tfctl.run_id"]) == {}


def test_down_and_resume_of_the_template_go_on_in_one_mlflow_run(
    tmp_path: Path, home: Path, lab: TestHostLab, server: MlflowServer
) -> None:
    template = copy_template("parameter-server", tmp_path, train_steps=20000)
    command = re.search(r"command: >-\n((?:  .*\n)+)", template.read_text())
    assert command is not None
    jobs = "  ps: [tfh0:2222]\n  chief: [tfh0:2223]\n  worker: [tfh1:2222, tfh2:2222]"
    extra = tracking(server.uri, "ps-resumed") + "\nlogdir: logs/{run_id}"
    line = " ".join(command.group(1).split())
    cluster = write_cluster(tmp_path, lab, jobs, line, extra=extra, workdir=template.parent, name="psr")
    cluster.write_text(cluster.read_text().replace("grace_period: 2", "grace_period: 30"))
    first = tfctl("-f", str(cluster), "up", "-d", home=home, timeout=300)
    assert first.returncode == 0, first.stderr
    (made,) = wait_until(lambda: server.runs("ps-resumed"), 30, "the MLflow run made")
    wait_until(lambda: server.history(made["id"], "loss"), 120, "the chief's first points", until=lambda h: len(h) >= 3)
    down = tfctl("-f", str(cluster), "down", home=home, timeout=120)
    assert down.returncode == 0, down.stderr
    before = server.history(made["id"], "loss")
    cluster.write_text(cluster.read_text().replace("--train_steps=20000", f"--train_steps={before[-1][0] + 600}"))
    again = tfctl("-f", str(cluster), "up", "--resume", home=home, timeout=300)
    assert again.returncode == 0, again.stderr + again.stdout[-3000:]
    resumed = re.search(r"resumed from \S+ at global step (\d+)", again.stdout)
    assert resumed is not None, again.stdout[-3000:]
    (same,) = server.runs("ps-resumed")  # one run for both sittings
    assert same["id"] == made["id"] and same["status"] == "FINISHED"
    after = [step for step, _ in server.history(made["id"], "loss") if step > before[-1][0]]
    assert after and min(after) > int(resumed.group(1)) - 100  # the second sitting went on from its checkpoint
    assert "test_accuracy" in same["metrics"] and same["tags"]["tfctl.latest_run"] != same["tags"]["tfctl.run_id"]
