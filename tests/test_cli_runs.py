"""`tfctl runs`: which runs it lists, by cluster file, as every other verb picks its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import add_run, tfctl

from tfctl.runs import RunRecord


@pytest.fixture
def runs(tmp_path: Path, home: Path) -> dict[str, RunRecord]:
    a, b = tmp_path / "a" / "cluster.yaml", tmp_path / "b.yaml"
    a.parent.mkdir()
    a.write_text("name: a\n")
    b.write_text("name: b\n")
    return {
        "a1": add_run(home, "a-20260101-100000-0001", a, 1_700_000_000, {"worker": 1}),
        "b1": add_run(home, "b-20260102-100000-0002", b, 1_700_100_000, {"worker": 1}),
        "a2": add_run(home, "a-20260103-100000-0003", a, 1_700_200_000, {"worker": 1}),
    }


def listed(home: Path, *args: str, cwd: Path | None = None) -> list[str]:
    result = tfctl(*args, "--json", home=home, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return [r["run_id"] for r in json.loads(result.stdout)]


def test_the_cluster_file_picks_the_runs_wherever_it_is_named(runs, home: Path, tmp_path: Path) -> None:
    a_runs = [runs["a1"].run_id, runs["a2"].run_id]
    b_file = str(tmp_path / "b.yaml")
    assert listed(home, "-f", b_file, "runs") == [runs["b1"].run_id]
    assert listed(home, "runs", "-f", b_file) == [runs["b1"].run_id]
    assert listed(home, "runs", "--file", b_file) == [runs["b1"].run_id]
    assert listed(home, "runs", cwd=tmp_path / "a") == a_runs  # ./cluster.yaml
    assert listed(home, "runs", "-f", "cluster.yaml", cwd=tmp_path / "a") == a_runs


def test_without_a_file_or_with_all_every_run_is_listed(runs, home: Path, tmp_path: Path) -> None:
    every = [r.run_id for r in runs.values()]
    assert listed(home, "runs", cwd=tmp_path) == every  # no ./cluster.yaml here
    assert listed(home, "runs", "--all", cwd=tmp_path / "a") == every


def test_a_file_without_runs_says_so(runs, home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    result = tfctl("runs", "-f", str(other), home=home)
    assert result.returncode == 0 and result.stdout == ""
    assert f"no runs of {other}" in result.stderr and "--all" in result.stderr
    table = tfctl("runs", "-f", str(tmp_path / "b.yaml"), home=home)
    assert table.stdout.split()[:4] == [runs["b1"].run_id, *table.stdout.split()[1:3], "succeeded"]
