"""`tfctl top` rendered once, from what the hosts say each task uses (fake backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fake_runs import started, tfctl_here, write
from tests.fakes import TaskScript
from tfctl.controller.top_view import sparkline
from tfctl.supervisor.protocol import Usage

MIB = 1 << 20


def samples(cpu: list[float], rss_mib: int, gpu: float | None = None) -> list[Usage]:
    return [
        Usage(1000.0 + 3 * i, c, rss_mib * MIB, gpu, None if gpu is None else 2048 * MIB) for i, c in enumerate(cpu)
    ]


@pytest.fixture
def run(fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """ps:0 idle, worker:0 hungry (CPU and memory) and slow, worker:1 steady."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    fake_backend.scripts.update(
        {
            "ps:0": TaskScript(usage=samples([1.0, 0.0, 0.5], 40)),
            "worker:0": TaskScript(lines=[f"step {n}" for n in range(4)], usage=samples([50.0, 190.0, 380.0], 3000)),
            "worker:1": TaskScript(lines=[f"step {n}" for n in range(0, 400, 10)], usage=samples([90.0, 95.0], 900)),
        }
    )
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    yield fake_backend
    assert tfctl_here("down").code == 0


def test_status_json_carries_each_tasks_usage(run) -> None:
    tasks = {t["task"]: t for t in json.loads(tfctl_here("status", "--json").out)["tasks"]}
    assert (tasks["worker:0"]["cpu_percent"], tasks["worker:0"]["rss_bytes"]) == (380.0, 3000 * MIB)
    assert tasks["ps:0"]["gpu_util_percent"] is None and tasks["ps:0"]["gpu_memory_bytes"] is None
    assert "usage_history" not in tasks["ps:0"]  # only `top` asks for it


def test_top_once_sorts_by_cpu_and_names_the_hungry_task(run) -> None:
    ran = tfctl_here("top", "--once")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    total_rss = (40 + 3000 + 900) / 1024
    assert f"3 tasks  cpu {380 + 95 + 0.5:.0f}%  rss {total_rss:.1f} GiB  sorted by cpu" in lines[0]
    assert lines[1].split()[:5] == ["TASK", "HOST", "STATE", "CPU", "CPU"]
    rows = [line.split() for line in lines[2:5]]
    assert [row[0] for row in rows] == ["worker:0", "worker:1", "ps:0"]
    assert rows[0][3:5] == ["380%", sparkline([50.0, 190.0, 380.0], 100.0)]
    assert rows[0][5:8] == ["2.9", "GiB", sparkline([3000.0] * 3)]
    assert rows[2][7] == sparkline([40.0] * 3, 3000.0)  # on the run's one memory scale
    assert "GPU" not in lines[1]  # no task has a GPU
    assert "worker:0: uses more CPU than the run's other tasks" in ran.out
    assert "worker:0: uses more memory than the run's other tasks" in ran.out
    assert "ps:0: uses more" not in ran.out


def test_top_sorted_by_rate_puts_the_straggler_first_with_gpus_shown(run) -> None:
    run.scripts["worker:1"].usage[-1] = Usage(1006.0, 95.0, 900 * MIB, 70.0, 1024 * MIB)
    ran = tfctl_here("top", "--once", "--sort", "rate")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert "GPU MEM" in lines[1]
    rows = [line.split() for line in lines[2:5]]
    assert [row[0] for row in rows] == ["worker:0", "worker:1", "ps:0"]  # slowest first; no rate last
    assert "70%" in rows[1] and "1.0 GiB" in " ".join(rows[1])
    assert "worker:0: a straggler: under half its job's median steps/s" in ran.out
