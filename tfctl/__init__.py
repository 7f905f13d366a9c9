"""tfctl: one cluster file, four verbs, nothing left running.

`import tfctl` gives the Python API (`__all__`): `tfctl.up(...)` starts a run and returns its
`Run`, `tfctl.run(id)` finds one, `tfctl.list_runs()` lists them. The names load lazily, on first
use: importing the package stays cheap (no TensorFlow, no paramiko, no rich here).
"""

from __future__ import annotations

TYPE_CHECKING = False  # (typing itself costs milliseconds to import: not done at run time)
if TYPE_CHECKING:
    from typing import Any

    from tfctl.api.handle import Run, Timeout, list_runs, run
    from tfctl.api.queueing import queue, submit
    from tfctl.api.starting import load_cluster, up
    from tfctl.api.sweeping import Sweep, sweep
    from tfctl.api.types import (
        Ended,
        Event,
        EventKind,
        LogLine,
        Metric,
        Metrics,
        QueueEntry,
        RunStatus,
        RunSummary,
        Stopped,
        TaskInfo,
        TaskMetrics,
    )
    from tfctl.errors import ConfigError, ConfigProblem, HostError, StartupError, TfctlError, UsageError
    from tfctl.supervisor.states import RunState, TaskState

__version__ = "0.1.0"

# The public names and the module each lives in: the promise `tests/test_api_names.py` pins.
_PUBLIC = {
    "up": "tfctl.api.starting",
    "load_cluster": "tfctl.api.starting",
    "run": "tfctl.api.handle",
    "list_runs": "tfctl.api.handle",
    "submit": "tfctl.api.queueing",
    "queue": "tfctl.api.queueing",
    "QueueEntry": "tfctl.api.types",
    "sweep": "tfctl.api.sweeping",
    "Sweep": "tfctl.api.sweeping",
    "Run": "tfctl.api.handle",
    "Timeout": "tfctl.api.handle",
    "RunStatus": "tfctl.api.types",
    "TaskInfo": "tfctl.api.types",
    "RunSummary": "tfctl.api.types",
    "Ended": "tfctl.api.types",
    "Stopped": "tfctl.api.types",
    "LogLine": "tfctl.api.types",
    "Metric": "tfctl.api.types",
    "Metrics": "tfctl.api.types",
    "TaskMetrics": "tfctl.api.types",
    "Event": "tfctl.api.types",
    "EventKind": "tfctl.api.types",
    "RunState": "tfctl.supervisor.states",
    "TaskState": "tfctl.supervisor.states",
    "TfctlError": "tfctl.errors",
    "UsageError": "tfctl.errors",
    "ConfigError": "tfctl.errors",
    "ConfigProblem": "tfctl.errors",
    "HostError": "tfctl.errors",
    "StartupError": "tfctl.errors",
}

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "Ended",
    "Event",
    "EventKind",
    "HostError",
    "LogLine",
    "Metric",
    "Metrics",
    "QueueEntry",
    "Run",
    "RunState",
    "RunStatus",
    "RunSummary",
    "StartupError",
    "Stopped",
    "Sweep",
    "TaskInfo",
    "TaskMetrics",
    "TaskState",
    "TfctlError",
    "Timeout",
    "UsageError",
    "list_runs",
    "load_cluster",
    "queue",
    "run",
    "submit",
    "sweep",
    "up",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tfctl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, an attribute like any other
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


def main() -> None:
    """The `tfctl` command. Ctrl-C while the command line loads exits quietly with 130, as it does
    at any later moment (`cli.app.main`), instead of printing a traceback from an import."""
    from tfctl.errors import EXIT_INTERRUPTED

    try:
        from tfctl.cli import main as run
    except KeyboardInterrupt:
        raise SystemExit(EXIT_INTERRUPTED) from None
    run()
