"""Runs placed on a pool through the real CLI, on this machine as a pool host with stand-in GPUs:
two runs side by side on GPUs of their own, a third refused for want of room (and one that can
never fit), a GPU busy with a process of another's skipped, and the holdings as the host itself
says them (`tfctl pool`) from the first claim to the last release."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, tfctl

GPUS = 4


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[dict[str, str]]:
    """This machine as a pool host with GPUS stand-in GPUs and a claims folder of the test's own;
    GPU processes of others are listed in `foreign` (`uuid, pid` lines, as nvidia-smi prints them)."""
    bin_dir, claims = tmp_path / "bin", tmp_path / "claims"
    bin_dir.mkdir()
    listing = "".join(f"{i}, GPU-{i}\\n" for i in range(GPUS))
    (bin_dir / "nvidia-smi").write_text(
        f"""#!/bin/sh
case "$1" in
  --query-compute-apps=gpu_uuid,pid) cat {tmp_path}/foreign 2>/dev/null ;;
  --query-compute-apps=*) ;;
  --query-gpu=index,utilization.gpu) ;;
  *) printf '{listing}' ;;
esac
"""
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    (tmp_path / "pool.yaml").write_text(f"hosts:\n  localhost: {{gpus: {GPUS}, cpus: 2, tasks: 6}}\n")
    yield {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TFCTL_CLAIMS_DIR": str(claims)}


def cluster(tmp_path: Path, name: str, worker: str = "{count: 2, gpus: 1}", seconds: float = 60) -> Path:
    path = tmp_path / f"{name}.yaml"
    command = f"{{python}} {FAKE_TASK} --port -1 --lines 1 --devices --sleep {seconds}"
    path.write_text(
        f"name: {name}\npool: ./pool.yaml\ngrace_period: 2\ncommand: {json.dumps(command)}\n"
        f"jobs:\n  ps: {{count: 1}}\n  worker: {worker}\n"
    )
    return path


def run(tmp_path: Path, lab: dict[str, str], *args: str) -> Any:
    return tfctl(*args, home=tmp_path / "home", env=lab, cwd=tmp_path)


def pool(tmp_path: Path, lab: dict[str, str]) -> dict[str, Any]:
    shown = run(tmp_path, lab, "pool", "./pool.yaml", "--json")
    assert shown.returncode == 0, shown.stderr
    (host,) = json.loads(shown.stdout)["hosts"]
    return dict(host)


def devices(tmp_path: Path, lab: dict[str, str], file: Path, tasks: int = 3) -> dict[str, str]:
    """task -> its CUDA_VISIBLE_DEVICES, as the task itself printed it."""

    def seen() -> dict[str, str]:
        found = {}
        for line in run(tmp_path, lab, "-f", str(file), "logs").stdout.splitlines():
            task, _, text = line.partition(" ")
            if text.strip().startswith("devices "):
                found[task.strip("[]| ")] = json.loads(text.strip()[len("devices ") :])["cuda"]
        return found

    return wait_until(seen, 30, "every task printing its devices", until=lambda f: len(f) == tasks)


def test_runs_share_a_pool_on_gpus_of_their_own_and_the_host_says_who_holds_what(
    tmp_path: Path, lab: dict[str, str]
) -> None:
    (tmp_path / "foreign").write_text("GPU-0, 4242\n")  # another's process computes on GPU 0
    first, second, third = (cluster(tmp_path, n) for n in ("first", "second", "third"))
    try:
        up = run(tmp_path, lab, "-f", str(first), "up", "-d")
        assert up.returncode == 0, up.stderr
        assert set(devices(tmp_path, lab, first).values()) == {"", "1", "2"}  # the ps sees no GPU
        second.write_text(second.read_text().replace("{count: 2, gpus: 1}", "{count: 1, gpus: 1}"))
        up = run(tmp_path, lab, "-f", str(second), "up", "-d")
        assert up.returncode == 0, up.stderr
        assert set(devices(tmp_path, lab, second, tasks=2).values()) == {"", "3"}
        held = pool(tmp_path, lab)
        assert held["gpus"]["free"] == [] and held["busy_elsewhere"] == {"0": [4242]}
        runs = {h["run_id"] for h in held["held"]}
        assert len(runs) == 2 and {h["resource"] for h in held["held"] if h["resource"].startswith("gpu")} == {
            "gpu-1",
            "gpu-2",
            "gpu-3",
        }
        assert held["tasks"] == {"limit": 6, "held": 5}
        refused = run(tmp_path, lab, "-f", str(third), "up", "-d")
        assert refused.returncode == 2
        assert "no room on pool pool now: worker:0 needs 1 GPU on one host; the most free on any host is 0" in (
            refused.stderr
        )
        assert "hint: `tfctl pool pool` shows what holds its hosts" in refused.stderr
    finally:
        for file in (first, second):
            run(tmp_path, lab, "-f", str(file), "down")
    assert pool(tmp_path, lab)["held"] == []


def test_a_run_too_big_for_the_pool_is_refused_before_any_host_is_asked(tmp_path: Path, lab: dict[str, str]) -> None:
    big = cluster(tmp_path, "big", worker="{count: 1, gpus: 8}")
    for args in (("up", "-d"), ("up", "--dry-run")):
        refused = run(tmp_path, lab, "-f", str(big), *args)
        assert refused.returncode == 2, refused.stdout
        assert (
            "the run can never fit on pool pool: worker:0 needs 8 GPUs on one host; the most free on any host is 4"
            in (refused.stderr)
        )
        assert "Traceback" not in refused.stderr


def test_dry_run_shows_the_placement_from_the_pool_file(tmp_path: Path, lab: dict[str, str]) -> None:
    shown = run(tmp_path, lab, "-f", str(cluster(tmp_path, "dry")), "up", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "placed on pool ./pool.yaml as if nothing else held it" in shown.stdout + shown.stderr
    assert "CUDA_VISIBLE_DEVICES='0'" in shown.stdout and "CUDA_VISIBLE_DEVICES='1'" in shown.stdout
    assert not (tmp_path / "claims").exists()  # no host was asked, nothing claimed


def test_the_pool_file_s_counts_are_checked_against_the_host(tmp_path: Path, lab: dict[str, str]) -> None:
    (tmp_path / "pool.yaml").write_text("hosts:\n  localhost: {gpus: [0, 7], cpus: 2}\n")
    refused = run(tmp_path, lab, "-f", str(cluster(tmp_path, "wrong", worker="{count: 2, gpus: 1}")), "up", "-d")
    assert refused.returncode == 2
    assert "localhost has no GPU 7; it has 0, 1, 2, 3, but pool ./pool.yaml hands it out" in refused.stderr
    assert "hint: correct `gpus` of localhost in the pool file" in refused.stderr
    assert pool(tmp_path, lab)["held"] == []


def test_a_run_placed_on_a_pool_resumes_from_the_files_of_the_last_one(tmp_path: Path, lab: dict[str, str]) -> None:
    path = tmp_path / "resume.yaml"
    command = 'if [ -e "$TFCTL_RUN_DIR/ckpt" ]; then echo resumed; else echo fresh; touch "$TFCTL_RUN_DIR/ckpt"; fi'
    path.write_text(
        f"name: resume\npool: ./pool.yaml\ngrace_period: 2\ncommand: {json.dumps(command)}\n"
        "jobs:\n  worker: {count: 1, gpus: 1}\n"
    )
    first = run(tmp_path, lab, "-f", str(path), "up")
    assert first.returncode == 0 and "[worker:0] fresh" in first.stdout, first.stdout + first.stderr
    again = run(tmp_path, lab, "-f", str(path), "up", "--resume")
    assert again.returncode == 0 and "[worker:0] resumed" in again.stdout, again.stdout + again.stderr
    report = run(tmp_path, lab, "-f", str(path), "report", "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0 and "resumed" in (tmp_path / "r.html").read_text()
    assert pool(tmp_path, lab)["held"] == []
