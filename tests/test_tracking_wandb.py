"""`tracking: {wandb: ...}` in W&B's offline mode (its files on disk, no server): the chief logs
through the templates' `tracker.py` into the run whose id tfctl gave it, tfctl's figures go into
the same run id, and `up --resume` hands the tasks that id again."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tests import wandb_files
from tests.conftest import REPO, no_warnings, tfctl

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None, reason="wandb is not installed (pip install -e '.[tracking]')"
)

PROGRAM = """\
import json, os, socket, sys, time
from tracker import open_tracker
tf = json.loads(os.environ["TF_CONFIG"])
server = socket.create_server(("", int(tf["cluster"][tf["task"]["type"]][tf["task"]["index"]].rsplit(":", 1)[1])))
print("told " + json.dumps({k: v for k, v in os.environ.items() if k.startswith("WANDB_")}, sort_keys=True), flush=True)
tracker = open_tracker()
for step in range(1, 4):
    print(f"step {step * 10}: loss {1.0 / step:.4f}", flush=True)
    if tracker is not None:
        tracker.metrics({"loss": 1.0 / step}, step * 10)
if tracker is not None:
    tracker.close()
"""


def offline_runs(folder: Path, run_id: str) -> list[Path]:
    return sorted(folder.glob(f"wandb/offline-run-*-{run_id}"))


def test_an_offline_wandb_run_gets_the_chiefs_numbers_and_tfctls_figures_under_one_id(
    tmp_path: Path, home: Path
) -> None:
    shutil.copy(REPO / "templates" / "tracker.py", tmp_path / "tracker.py")
    (tmp_path / "train.py").write_text(PROGRAM)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: wb
workdir: {tmp_path}
command: "{{python}} train.py"
jobs:
  worker: [localhost, localhost]
tracking:
  wandb: {{project: tfctl-test, mode: offline}}
""")
    env = {"WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config")}
    up = tfctl("-f", str(cluster), "up", home=home, timeout=240, env=env)
    assert up.returncode == 0, up.stderr + up.stdout[-2000:]
    no_warnings(up.stderr)
    record = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]
    (link,) = record["tracking"]
    assert link["tracker"] == "wandb" and link["run_id"] == record["run_id"] and link["missed"] == []
    told = [json.loads(line.split("] told ", 1)[1]) for line in up.stdout.splitlines() if "] told " in line]
    assert len(told) == 2 and all(t["WANDB_RUN_ID"] == record["run_id"] for t in told)
    assert told[0]["WANDB_RESUME"] == "allow" and told[0]["WANDB_MODE"] == "offline"
    assert told[0]["WANDB_PROJECT"] == "tfctl-test" and told[0]["WANDB_RUN_GROUP"] == "wb"
    (chiefs,) = offline_runs(tmp_path, record["run_id"])  # the chief's alone: worker 1 logged nothing
    chief = wandb_files.read(chiefs / f"run-{record['run_id']}.wandb")
    assert (chief.run_id, chief.project, chief.group) == (record["run_id"], "tfctl-test", "wb")
    assert [(h["_step"], h["loss"]) for h in chief.history] == [(10, 1.0), (20, 0.5), (30, pytest.approx(1 / 3))]
    (tfctls,) = offline_runs(home / "runs" / record["run_id"], record["run_id"])
    mine = wandb_files.read(tfctls / f"run-{record['run_id']}.wandb")
    assert mine.run_id == record["run_id"] and "artifact" in mine.kinds  # the report
    assert mine.summary["tfctl/state"] == "succeeded" and mine.summary["tfctl/wall_seconds"] > 0
    assert mine.summary["tfctl/loss"]["_type"] == "table-file" and mine.summary["tfctl/loss"]["nrows"] == 3
    assert not [h for h in mine.history if "tfctl/loss" in h]  # no logged step: the chief's steps stay its own

    again = tfctl("-f", str(cluster), "up", "--resume", home=home, timeout=240, env=env)
    assert again.returncode == 0, again.stderr
    resumed = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]
    assert resumed["run_id"] != record["run_id"] and resumed["tracking"][0]["run_id"] == record["run_id"]
    told = [json.loads(line.split("] told ", 1)[1]) for line in again.stdout.splitlines() if "] told " in line]
    assert {t["WANDB_RUN_ID"] for t in told} == {record["run_id"]}
    assert len(offline_runs(tmp_path, record["run_id"])) == 2  # the chief's two sittings of one run
