"""A real TensorFlow 1 ps + 2 worker run of examples/mnist under tfctl, to the end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import REPO, free_ports, marked_processes, no_warnings, port_listening, tfctl

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed (pip install -e '.[tf]')"
    ),
]


def test_mnist_runs_to_completion_and_the_ps_stops(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: mnist-test
workdir: {REPO / "examples" / "mnist"}
command: "{{python}} train.py --job_name={{job_name}} --task_index={{task_index}} --ps_hosts={{ps_hosts}} --worker_hosts={{worker_hosts}} --train_steps 6000"
grace_period: 5
jobs:
  ps: [localhost:{ports[0]}]
  worker: [localhost:{ports[1]}, localhost:{ports[2]}]
""")
    up = tfctl("-f", str(cluster), "up", home=home, timeout=300)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    assert "job succeeded: worker:0 finished successfully" in up.stderr
    no_warnings(up.stderr)
    assert "[worker:0] final test accuracy" in up.stdout
    accuracy = float(up.stdout.split("final test accuracy ")[1].split()[0])
    assert accuracy > 0.8
    # Worker 1 joined the run and ended cleanly.
    assert any(line.startswith("[worker:1] data: ") for line in up.stdout.splitlines())
    # TF's own server line proves the ps ran a real gRPC server on its port.
    assert "[ps:0]" in up.stdout and "Started server with target: grpc://" in up.stdout
    run = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]
    run_id = run["run_id"]
    # The result is the program's final evaluation, not the last training batch's accuracy.
    result = {"accuracy": {"value": accuracy, "step": run["result"]["accuracy"]["step"], "task": "worker:0"}}
    assert run["result"] == result and result["accuracy"]["step"] >= 6000
    shot = json.loads(tfctl("status", "--json", "--run", run_id, home=home).stdout)
    assert shot["run"]["result"] == result
    page = tfctl("report", "--run", run_id, "-o", "-", home=home).stdout
    assert f"<th>result</th><td>accuracy {accuracy:.4g} (step " in page
    states = {t["task"]: t for t in shot["tasks"]}
    assert states["ps:0"]["state"] == "stopped"  # it never exits by itself; tfctl stopped it
    assert states["worker:0"]["state"] == "succeeded" and states["worker:0"]["exit_code"] == 0
    assert states["worker:1"]["state"] in ("succeeded", "stopped")
    assert not [pid for pid, (_, run) in marked_processes().items() if run == run_id]
    assert not any(port_listening(p) for p in ports)
