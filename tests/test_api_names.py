# ruff: noqa: E501 - the pinned signatures are kept whole, one a line, to be read and diffed
"""The Python API's promise: the names `import tfctl` offers and their signatures, pinned. A
change to either fails here until PINNED is changed with it, and the changelog says so; and
importing `tfctl` stays as cheap as a package docstring."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import subprocess
import sys

import tfctl

# When this fails: a public name or signature changed. If that is meant, change PINNED and name
# the change in CHANGELOG.md (scripts and notebooks rely on these).
PINNED = {
    "ConfigError": "exception(UsageError, TfctlError)",
    "ConfigProblem": "fields file: Path, line: int | None, column: int | None, key_path: str, message: str, fix: str | None",
    "Ended": "fields id: str, state: RunState, reason: str | None, ended_at: float | None, result: Mapping[str, Metric], task: str | None, diagnosis: Mapping[str, Any] | None; succeeded (property)",
    "Event": "fields kind: EventKind, source: str, text: str",
    "EventKind": "enum PROGRESS, LINE",
    "HostError": "exception(TfctlError)",
    "LogLine": "fields task: str, text: str",
    "Metric": "fields value: float, step: int | None, task: str",
    "Metrics": "fields tasks: tuple[TaskMetrics, ...], result: Mapping[str, Metric]; task(self, name: 'str') -> 'TaskMetrics'",
    "Run": "fields id: str, home: Path; down(self, grace: 'float | None' = None) -> 'Stopped'; logs(self, *, follow: 'bool' = False, tasks: 'Sequence[str]' = (), since: 'float | None' = None, tail: 'int | None' = None) -> 'Iterator[LogLine]'; metrics(self) -> 'Metrics'; report(self, path: 'str | os.PathLike[str]') -> 'Path'; status(self) -> 'RunStatus'; wait(self, timeout: 'float | None' = None) -> 'Ended'",
    "QueueEntry": "fields id: str, state: RunState, priority: int, position: int | None, why: str | None, submitted_at: float, pool: str",
    "RunState": "enum QUEUED, STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED",
    "RunStatus": "fields id: str, cluster: str, file: str, state: RunState, reason: str | None, started_at: float, ended_at: float | None, tasks: tuple[TaskInfo, ...], result: Mapping[str, Metric], unreachable_hosts: Mapping[str, str], data: Mapping[str, Any]; from_json(cls, data: 'Mapping[str, Any]') -> 'RunStatus' (classmethod); task(self, name: 'str') -> 'TaskInfo'",
    "RunSummary": "fields id: str, cluster: str, file: str, state: RunState, created_at: float, ended_at: float | None, reason: str | None, resumes: str | None, result: Mapping[str, Metric]; active (property)",
    "StartupError": "exception(TfctlError)",
    "Stopped": "fields processes: int, hosts: int, ended: int, remaining: Mapping[str, tuple[int, ...]], unreachable: Mapping[str, str], containers_left: Mapping[str, tuple[str, ...]], released: str | None; clean (property)",
    "Sweep": "fields id: str, home: Path; down(self) -> 'list[str]'; results(self, sort_by: 'str | None' = None, smallest: 'bool' = False) -> 'list[dict[str, Any]]'; trials (property); wait(self, timeout: 'float | None' = None) -> 'dict[str, Any]'",
    "TaskInfo": "fields name: str, job: str, index: int, host: str, port: int | None, state: TaskState, pid: int | None, exit_code: int | None, signal: int | None, listening: bool, uptime: float | None, last_line: str, restarts: int, step: int | None, steps_per_sec: float | None, epoch: int | None, flags: tuple[str, ...], diagnosis: Mapping[str, Any] | None, data: Mapping[str, Any]; from_json(cls, data: 'Mapping[str, Any]') -> 'TaskInfo' (classmethod)",
    "TaskMetrics": "fields task: str, steps: tuple[tuple[float, float], ...], series: Mapping[str, tuple[tuple[float, float], ...]]",
    "TaskState": "enum PENDING, STARTING, RUNNING, RESTARTING, SUCCEEDED, FAILED, STOPPED, LOST, UNREACHABLE",
    "TfctlError": "exception()",
    "Timeout": "exception(TfctlError)",
    "UsageError": "exception(TfctlError)",
    "list_runs": "(cluster: 'str | os.PathLike[str] | None' = None, *, home: 'str | os.PathLike[str] | None' = None) -> 'list[RunSummary]'",
    "load_cluster": "(path: 'str | os.PathLike[str]', params: 'Mapping[str, Any] | None' = None) -> 'ClusterConfig'",
    "queue": "(*, home: 'str | os.PathLike[str] | None' = None) -> 'list[QueueEntry]'",
    "submit": "(cluster: 'str | os.PathLike[str] | ClusterConfig', *, priority: 'int' = 0, params: 'Mapping[str, Any] | None' = None, home: 'str | os.PathLike[str] | None' = None) -> 'Run'",
    "run": "(run_id: 'str', *, home: 'str | os.PathLike[str] | None' = None) -> 'Run'",
    "sweep": "(cluster: 'str | os.PathLike[str]', *, params: 'Mapping[str, Any] | None' = None, max_parallel: 'int | None' = None, home: 'str | os.PathLike[str] | None' = None) -> 'Sweep'",
    "up": "(cluster: 'str | os.PathLike[str] | ClusterConfig', *, detach: 'bool' = True, params: 'Mapping[str, Any] | None' = None, resume: 'str | None' = None, accept_new_host_keys: 'bool' = False, progress: 'Callable[[Event], None] | None' = None, home: 'str | os.PathLike[str] | None' = None) -> 'Run'",
}


def described(name: str) -> str:
    """A public name as PINNED says it: a function's signature; a class's fields, methods and
    properties; an enum's members; an exception's bases."""
    obj = getattr(tfctl, name)
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return "enum " + ", ".join(m.name for m in obj)
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return "exception(" + ", ".join(c.__name__ for c in obj.__mro__[1:] if c.__module__.startswith("tfctl")) + ")"
    if inspect.isclass(obj):
        parts = []
        if dataclasses.is_dataclass(obj):
            parts.append("fields " + ", ".join(f"{f.name}: {f.type}" for f in dataclasses.fields(obj)))
        for attr, value in sorted(vars(obj).items()):
            if attr.startswith("_"):
                continue
            if inspect.isfunction(value):
                parts.append(f"{attr}{inspect.signature(value)}")
            elif isinstance(value, property):
                parts.append(f"{attr} (property)")
            elif isinstance(value, classmethod):
                parts.append(f"{attr}{inspect.signature(value.__func__)} (classmethod)")
        return "; ".join(parts)
    return f"{inspect.signature(obj)}"


def test_the_public_names_are_the_pinned_ones() -> None:
    assert sorted(tfctl.__all__) == sorted(PINNED) == sorted(tfctl._PUBLIC)


def test_every_public_signature_is_the_pinned_one() -> None:
    changed = {name: described(name) for name in tfctl.__all__ if described(name) != PINNED[name]}
    assert changed == {}


def test_every_public_name_says_what_it_is_for() -> None:
    assert [name for name in tfctl.__all__ if not inspect.getdoc(getattr(tfctl, name))] == []


def test_importing_tfctl_loads_nothing_heavy_until_a_call_needs_it() -> None:
    code = (
        "import sys, tfctl\n"
        "heavy = ('tensorflow', 'paramiko', 'rich', 'click', 'yaml', 'tfctl.api')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
        "tfctl.Run, tfctl.up\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy[:4])))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "[]"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        tfctl.no_such_thing  # noqa: B018 - the access is the test
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("tfctl.no_such_thing did not raise")
