"""What the verbs share: how they find the cluster file, the run store and the run."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from tfctl.errors import UsageError

if TYPE_CHECKING:
    from tfctl.runs.record import RunRecord, TaskSpec
    from tfctl.runs.store import RunStore

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_FILE = Path("cluster.yaml")


class Duration(click.ParamType):
    """`90s`, `5m`, `2h`, `1h30m`, `30d`, `2w` -> seconds, as `docker logs --since` takes them."""

    name = "duration"
    UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()  # a bare number is refused: seconds? days?
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", text)
        if not parts or "".join(n + u for n, u in parts) != text:
            self.fail(f"{value!r} is not a duration: write e.g. 90s, 5m, 2h or 1h30m", param, ctx)
        return sum(float(n) * self.UNITS[u] for n, u in parts)

    @classmethod
    def text(cls, seconds: float) -> str:
        """Seconds as written on the command line: 2592000 -> `30d` (the largest whole unit)."""
        for unit, size in sorted(cls.UNITS.items(), key=lambda item: -item[1]):
            if seconds >= size and seconds % size == 0:
                return f"{seconds / size:g}{unit}"
        return f"{seconds:g}s"


def file_option(short: bool = True) -> Callable[[F], F]:
    names = ("-f", "--file") if short else ("--file",)
    return click.option(
        *names,
        "cluster_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Cluster file (default: ./cluster.yaml).",
    )


set_option = click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="NAME=VALUE",
    help="Give a parameter of the file's `params:` this value (as YAML reads it: 0.01, true, adam); repeatable.",
)
accept_new_option = click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Trust and pin SSH host keys seen for the first time (like StrictHostKeyChecking=accept-new); "
    "a changed key is always refused.",
)


def named_file(ctx: click.Context, given: Path | None) -> Path | None:
    """The cluster file named after the verb, else before it (`tfctl -f FILE verb`), else None.
    Read from the parsed parameters, so shell completion (which runs no callbacks) sees it too."""
    return given or ctx.find_root().params.get("cluster_file")


def cluster_file_path(ctx: click.Context, given: Path | None) -> Path:
    path = named_file(ctx, given)
    if path is not None:
        return path
    if not DEFAULT_FILE.exists():
        raise UsageError(
            "no cluster.yaml in the current directory",
            hint="pass -f FILE, or start a project with `tfctl init` (`tfctl init .` writes it here)",
        )
    return DEFAULT_FILE


def run_store() -> RunStore:
    from tfctl.runs.store import RunStore

    return RunStore()


def run_record(
    ctx: click.Context, given: Path | None, run_id: str | None, resume: bool = True, queued: bool = False
) -> RunRecord:
    """The run the command is about. With `resume`, a live run whose controller died gets a new
    watcher first, and the user hears of it. A queued run (no task yet) only where `queued`
    says the command has something to do with one."""
    from tfctl import console
    from tfctl.controller.live import driver
    from tfctl.runs.store import resolve_run
    from tfctl.supervisor.states import RunState

    path = None if run_id else cluster_file_path(ctx, given)
    store = run_store()
    record = resolve_run(store, path or Path("."), run_id, queued)
    if record.state is RunState.QUEUED and not queued:
        raise UsageError(
            f"run {record.run_id} is queued: it has no tasks yet",
            hint=f"`tfctl queue` shows its place and why it waits; `tfctl cancel {record.run_id}` takes it out",
        )
    note = driver.resume(store, record) if resume else None
    if note:
        from rich.text import Text

        console.err().print(Text("warning:", style="yellow") + Text(f" {note}"))  # the note may quote a host
        record = store.load(record.run_id)
    return record


def stamp(start: float) -> str:
    return f"[{time.monotonic() - start:5.1f}s]"


def select_task(record: RunRecord, name: str) -> TaskSpec:
    """One task: `job:index`, or `job` when that job has a single task."""
    match = [t for t in record.tasks if name in (t.job, t.name)]
    if len(match) == 1:
        return match[0]
    if match:
        raise UsageError(
            f"job {name!r} has {len(match)} tasks in run {record.run_id}: name one",
            hint=f"choose from: {', '.join(t.name for t in match)}",
        )
    jobs = [t.job for t in record.tasks]
    valid = ", ".join(sorted({t.name for t in record.tasks} | {j for j in jobs if jobs.count(j) == 1}))
    raise UsageError(f"no task {name!r} in run {record.run_id}", hint=f"choose from: {valid}")
