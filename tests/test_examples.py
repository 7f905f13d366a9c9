"""The examples under examples/ run for real under tfctl, as their READMEs say, and a healthy run
prints no warning: all-reduce (MultiWorkerMirroredStrategy), and async and sync TF1 training."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, no_warnings, tfctl

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed (pip install -e '.[tf]')"
    ),
]


def copy_example(name: str, cluster_file: str, tmp_path: Path, shorter: tuple[str, str]) -> Path:
    """The example as a user's copy, with less training (`shorter`: flag to replace). It names no
    port (its hosts pick free ones at `up`), so no two runs of the shipped files collide."""
    dst = tmp_path / name
    shutil.copytree(REPO / "examples" / name, dst, ignore=shutil.ignore_patterns("__pycache__"))
    cluster = dst / cluster_file
    text = cluster.read_text()
    assert "localhost" in text and not re.search(r"localhost:\d", text)
    flag, value = shorter
    text, n = re.subn(rf"{flag}=\S+", f"{flag}={value}", text)
    if n == 0:
        text = text.replace("{python} train.py", f"{{python}} train.py {flag}={value}")
    cluster.write_text(text)
    return cluster


def steps(home: Path) -> dict[str, int | None]:
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    tasks = json.loads(tfctl("status", "--json", "--run", run_id, home=home).stdout)["tasks"]
    return {t["task"]: t["step"] for t in tasks}


def test_allreduce(tmp_path: Path, home: Path) -> None:
    cluster = copy_example("allreduce", "cluster.yaml", tmp_path, ("--epochs", "2"))
    up = tfctl("-f", str(cluster), "up", home=home, timeout=300)
    assert up.returncode == 0 and "job succeeded" in up.stderr, up.stderr[-3000:] + up.stdout[-3000:]
    no_warnings(up.stderr)
    found = steps(home)
    assert found["worker:0"] is not None and found["worker:0"] == found["worker:1"]


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_async_vs_sync(tmp_path: Path, home: Path, mode: str) -> None:
    cluster = copy_example("async-vs-sync", f"cluster-{mode}.yaml", tmp_path, ("--train_steps", "200"))
    up = tfctl("-f", str(cluster), "up", home=home, timeout=300)
    assert up.returncode == 0 and "job succeeded" in up.stderr, up.stderr[-3000:] + up.stdout[-3000:]
    no_warnings(up.stderr)
    found = steps(home)
    assert found["worker:0"] is not None and found["worker:1"] is not None and found["ps:0"] is None
