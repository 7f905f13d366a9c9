"""`tfctl status --watch` on the fake backend, in this process: into a pipe a plain table per
refresh, each under a line saying when; on a terminal one table redrawn; both end once the run has
ended, its last table shown. The refresh waits on a fake clock, so no test waits a second."""

from __future__ import annotations

import io
import re
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.fake_runs import end, in_thread, returned, started, tfctl_here, write
from tests.fakes import TaskScript
from tfctl.cli import inspect
from tfctl.cli.app import Environment
from tfctl.console import make_console
from tfctl.controller.live import driver
from tfctl.controller.live import rpc as live
from tfctl.engine.clock import FakeClock
from tfctl.supervisor.protocol import RunState

HEADER = re.compile(r"^--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ---$", re.M)


@pytest.fixture
def lab(fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    fake_backend.scripts.update(
        {
            "ps:0": TaskScript(lines=["ps: listening"]),
            "worker:0": TaskScript(lines=["step 1", "step 2"]),  # runs until stopped
            "worker:1": TaskScript(lines=["step 1"]),
        }
    )
    return fake_backend


class Clock(FakeClock):
    """The watch's clock: every pause it takes is noted, and `on_sleep` runs in it."""

    def __init__(self, on_sleep: Callable[[int], None] = lambda _n: None) -> None:
        super().__init__()
        self.pauses: list[float] = []
        self.on_sleep = on_sleep

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.on_sleep(len(self.pauses))
        super().sleep(seconds)


def until(condition: Callable[[], bool], patience: float = 10.0) -> None:
    deadline = time.monotonic() + patience
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        threading.Event().wait(0.005)


def frames(out: str) -> list[str]:
    """The tables of a piped `status --watch`, each without its time line."""
    assert HEADER.match(out), out
    return [part.strip("\n") for part in HEADER.split(out)[1:]]


def test_watch_of_a_run_that_has_ended_prints_its_table_once_and_ends(lab, tmp_path, monkeypatch):
    store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    run_id = cluster.record.run_id
    end(store, run_id, RunState.SUCCEEDED, "worker:0 finished successfully")
    clock = Clock()
    ran = tfctl_here("status", "--watch", env=Environment(clock))
    assert ran.code == 0, ran.err
    assert clock.pauses == []  # nothing more to show: no refresh
    (table,) = frames(ran.out)
    assert table.startswith(f"{run_id}  (succeeded: worker:0 finished successfully)")
    assert table + "\n" == tfctl_here("status").out  # the very table `status` prints


def test_watch_into_a_pipe_prints_a_plain_table_per_refresh_until_the_run_ends(lab, tmp_path, monkeypatch):
    store, cluster = started(tmp_path / "cluster.yaml", attached=True)
    run_id = cluster.record.run_id

    def worker_0_ends_at_the_second_pause(n: int) -> None:
        if n == 2:
            lab.scripts["worker:0"].end_after = 1
            until(lambda: not store.load(run_id).active)  # the attached `up` recorded the end

    clock = Clock(worker_0_ends_at_the_second_pause)
    with cluster, in_thread(lambda: driver.attach(store, cluster, lambda batch: None)) as ended:
        until(live.socket_path(store.run_dir(run_id)).exists)
        ran = tfctl_here("status", "--watch", env=Environment(clock))
    assert ran.code == 0, ran.err
    assert returned(ended).outcome.reason == "worker:0 finished successfully"
    assert clock.pauses == [inspect.WATCH_EVERY] * 2
    assert "\x1b" not in ran.out and "\r" not in ran.out  # no colour, no cursor move
    first, second, last = frames(ran.out)
    assert first.startswith(f"{run_id}  (running)") and second.startswith(f"{run_id}  (running)")
    assert last.startswith(f"{run_id}  (succeeded: worker:0 finished successfully)")
    assert re.search(r"^worker:0 +h1:2223 +succeeded ", last, re.M), last
    # the time line is the clock's: the frames are a second apart
    stamps = [time.mktime(time.strptime(h[4:-4], "%Y-%m-%d %H:%M:%S")) for h in HEADER.findall(ran.out)]
    assert [b - a for a, b in zip(stamps, stamps[1:])] == [1.0, 1.0]


class Screen(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tables", [["done"], ["one", "two", "three, the last"]])
def test_watch_on_a_terminal_redraws_one_table_and_ends_with_the_runs_last(tables: list[str]) -> None:
    shown = iter((text, i == len(tables) - 1) for i, text in enumerate(tables))
    screen, clock = Screen(), Clock()
    inspect.watch_frames(lambda: next(shown), make_console(screen), clock)
    assert next(shown, None) is None  # every table asked for, none after the last
    assert clock.pauses == [inspect.WATCH_EVERY] * (len(tables) - 1)
    drawn = screen.getvalue()
    assert "---" not in drawn and drawn.count("\r\x1b[2K") == len(tables)  # each drawn over the one before
    assert drawn.endswith(f"\r\x1b[2K{tables[-1]}\n\x1b[?25h")  # the run's last table stays, the cursor back
