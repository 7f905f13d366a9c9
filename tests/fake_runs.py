"""Runs of the fake backend (tests/fake_backend) in this process: a cluster file, a started run,
and the CLI called as `tfctl` is, without a subprocess (so what it runs counts as covered)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from click.testing import CliRunner

from tfctl.cli import main
from tfctl.cli.app import Environment
from tfctl.cluster.cluster import Cluster
from tfctl.config.loader import load_config
from tfctl.controller.live import launch
from tfctl.controller.verbs import up
from tfctl.runs import transitions
from tfctl.runs.record import Controller, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState

# ps:0 and worker:0 on h1, worker:1 on h2; the ps runs until stopped, as a ps does.
FAKE_FILE = """\
name: fake
backend: fake
fake: {pool: gpus}
command: train --job_name={job_name} --task_index={task_index}
jobs:
  ps: [h1:2222]
  worker: [h1:2223, h2:2222]
"""


def write(tmp_path: Path, text: str = FAKE_FILE, extra: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text + extra)
    return path


def started(path: Path, attached: bool = False, watcher: Controller | None = None) -> tuple[RunStore, Cluster]:
    """A run of the cluster file, started on the fake lab; detached with no controller unless
    `attached` (this process holds it) or `watcher` (who the record says supervises it)."""
    store = RunStore()
    plan = up.acquire(store, load_config(path), lambda *_: None)
    return store, launch.launch(store, plan, lambda *_: None, detach=not attached, watcher=watcher)


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def tfctl_here(*args: str, env: Environment | None = None) -> Ran:
    """`tfctl ARGS` through its entry point (`cli.main`: exit codes, `error:` and `hint:`), its
    stdout and stderr captured by click's CliRunner; `env`: what it meets (its clock)."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        argv, sys.argv = sys.argv, ["tfctl", *args]
        try:
            main(env)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            sys.argv = argv
            sys.stdout.flush()
            sys.stderr.flush()
        return Ran(code, out.getvalue().decode(), err.getvalue().decode())


def returned(result: list[Any]) -> Any:
    """What `in_thread`'s function returned; if it raised, a failure showing where and why (not
    an AttributeError on the exception later)."""
    assert result, "the thread returned nothing"
    if isinstance(result[0], BaseException):
        raise AssertionError("the thread raised:\n" + "".join(traceback.format_exception(result[0])))
    return result[0]


@contextlib.contextmanager
def in_thread(fn: Callable[[], Any], patience: float = 10.0) -> Iterator[list[Any]]:
    """Run `fn` on a thread for the body of the `with` (another terminal's controller); its
    result (or exception) is in the yielded list once the body ends and the thread is joined."""
    result: list[Any] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test, which asserts on it
            result.append(e)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        thread.join(patience)
        assert not thread.is_alive(), "the controller's thread did not end"


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """The body may set its own SIGTERM handler (a watcher's); the test's comes back after."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def amend(store: RunStore, run_id: str, **changes: Any) -> RunRecord:
    """A test's own edit of a stored record (a dead controller, an older start): tfctl changes a
    record only through `runs.transitions`, which has no transition for a test's make-believe."""
    with store.lock():
        changed = store.load(run_id).replace(**changes)
        store.save(changed)
    return changed


def end(store: RunStore, run_id: str, state: RunState, why: str) -> RunRecord:
    """The run ended as tfctl ends one (`transitions.end_if_active`)."""
    ended = transitions.apply(store, run_id, transitions.end_if_active(state, why, time.time()))
    assert ended is not None, f"run {run_id} had ended already"
    return ended
