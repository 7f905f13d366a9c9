"""`tfctl top` rendered once, from what the hosts say each task uses (fake backend)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.conftest import fake, free_ports, tfctl
from tests.fake_runs import started, tfctl_here, write
from tests.fakes import TaskScript
from tests.test_cli_localhost import write_cluster
from tfctl.controller.views.top_view import answer_key, sparkline, top_screen
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


# ---------------------------------------------------------------- the screen, as pure text


def task_json(name: str, cpu: float, rss_mib: int, step: int | None, rate: float | None, host: str = "h1") -> dict:
    return {
        "task": name,
        "job": name.split(":")[0],
        "host": host,
        "state": "running",
        "cpu_percent": cpu,
        "rss_bytes": rss_mib * MIB,
        "step": step,
        "steps_per_sec": rate,
        "uptime": 95.0,
        "last_line": f"step {step} loss 0.{step}",
        "usage_history": [{"cpu_percent": cpu * i / 12, "rss_bytes": rss_mib * MIB} for i in range(12)],
    }


def run_json(workers: int) -> dict:
    tasks = [task_json("ps:0", 3.0, 400, None, None)]
    tasks += [task_json(f"worker:{i}", 50.0 + i, 900 + i, 400 + i, 2.0, f"node{i}") for i in range(workers)]
    return {"run": {"id": "demo-1", "state": "running"}, "tasks": tasks}


def headings(screen: str) -> list[str]:
    return screen.splitlines()[1].replace(" HISTORY", "_HISTORY").replace("LAST LINE", "LAST_LINE").split()


@pytest.mark.parametrize(
    "width, wanted, dropped",
    [
        (
            200,
            ["TASK", "HOST", "STATE", "CPU", "CPU_HISTORY", "RSS", "RSS_HISTORY", "STEP", "STEPS/S", "LAST_LINE"],
            [],
        ),
        (90, ["TASK", "HOST", "STATE", "CPU", "RSS", "STEP", "STEPS/S", "LAST_LINE"], ["CPU_HISTORY", "RSS_HISTORY"]),
        (60, ["TASK", "HOST", "STATE", "CPU", "RSS", "STEP", "STEPS/S"], ["CPU_HISTORY", "LAST_LINE", "UPTIME"]),
        (52, ["TASK", "STATE", "CPU", "RSS", "STEP", "STEPS/S"], ["HOST", "UPTIME", "LAST_LINE"]),
        (30, ["TASK", "STATE", "CPU"], ["RSS", "STEP"]),
    ],
)
def test_a_narrow_terminal_drops_the_histories_before_rss_and_step(width, wanted, dropped) -> None:
    screen = top_screen(run_json(3), "cpu", width).plain
    assert all(cell_len(line) <= width for line in screen.splitlines()), screen
    shown = headings(screen)
    assert [h for h in shown if h in wanted] == wanted and not set(dropped) & set(shown), shown
    if "RSS" in shown:
        row = next(line for line in screen.splitlines() if line.startswith("worker:2 "))
        assert "902 MiB" in row


@pytest.mark.parametrize("height", [8, 20, 40])
def test_tasks_beyond_the_screen_become_one_line_that_counts_them(height) -> None:
    screen = top_screen(run_json(50), "cpu", 100, height, keys=True).plain.splitlines()
    assert len(screen) <= height
    rows = [line for line in screen if line.startswith(("worker:", "ps:"))]
    (more,) = [line for line in screen if "more tasks below" in line]
    assert more == f"… {51 - len(rows)} more tasks below (sorted by cpu)"
    assert rows[0].startswith("worker:49 ")  # the busiest first
    assert screen[-1].startswith("s: sort by mem")


def test_each_job_of_several_tasks_gets_a_totals_row() -> None:
    screen = top_screen(run_json(4), "task", 200).plain.splitlines()
    (total,) = [line.split() for line in screen if line.startswith("worker ×4")]
    assert total[2:4] == ["4", "running"]
    assert f"{50 + 51 + 52 + 53}%" in total and "3.5" in total and "GiB" in total  # 3606 MiB
    assert total[-2:] == ["403", "8"]  # its highest step; the job's steps/s
    assert not [line for line in screen if line.startswith("ps ×")]  # one task: its row says it all


@pytest.mark.parametrize(
    "key, sort, after",
    [("s", "cpu", "mem"), ("s", "task", "cpu"), ("P", "rate", "cpu"), ("M", "cpu", "mem"), ("x", "gpu", "gpu")],
)
def test_keys_change_the_sort_as_htop_users_expect(key, sort, after) -> None:
    assert answer_key(key, sort) == after


def test_q_quits() -> None:
    assert answer_key("q", "cpu") is None and answer_key("Q", "mem") is None


# ---------------------------------------------------------------- keys, in a real terminal


def read_until(fd: int, wanted: str, timeout: float = 30.0) -> str:
    """What the terminal showed until `wanted` appeared (or the time ran out: the test fails)."""
    seen, end = b"", time.monotonic() + timeout
    while wanted.encode() not in seen and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the other end closed
                break
    assert wanted.encode() in seen, seen[-2000:]
    return seen.decode(errors="replace")


def test_top_in_a_terminal_sorts_on_s_and_quits_on_q_leaving_the_terminal_as_it_was(tmp_path, home) -> None:
    ports = free_ports(3)
    cluster = write_cluster(
        tmp_path, ports, fake(f"--name ps --port {ports[0]} --sleep -1"), fake("--name w --steps-per-sec 5 --sleep -1")
    )
    assert tfctl("-f", str(cluster), "up", "-d", home=home).returncode == 0
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))
    before = termios.tcgetattr(terminal)
    shown = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "top", "--interval", "1"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "TFCTL_HOME": str(home), "TERM": "xterm", "COLUMNS": "", "LINES": ""},
        start_new_session=True,
    )
    try:
        screen = read_until(master, "s: sort by mem")
        assert "sorted by cpu" in screen and "worker:1" in screen
        os.write(master, b"s")
        read_until(master, "sorted by mem", timeout=5)  # at once, not at the next poll
        os.write(master, b"q")
        assert shown.wait(10) == 0
        assert termios.tcgetattr(terminal) == before  # echo and line editing back
    finally:
        if shown.poll() is None:
            shown.kill()
            shown.wait()
        os.close(master)
        os.close(terminal)
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0
