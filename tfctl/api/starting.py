"""Starting a run, for `tfctl up` and `tfctl.up()` alike: attached (this thread follows it to
its end) or detached (a watcher process starts it, says how the start went, and ends the run
when its job is done). The CLI forks its watcher, which then holds the imports already made;
the API starts a new process instead, since a notebook kernel or a threaded program cannot be
forked safely."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tfctl.api.handle import Run
from tfctl.api.types import Event, EventKind
from tfctl.controller.live.spawn import Progress, Started, Starter, relay, spawner
from tfctl.errors import TfctlError, UsageError
from tfctl.runs.store import RunStore

if TYPE_CHECKING:
    from tfctl.config.model import ClusterConfig
    from tfctl.controller.start.plan import Draft

__all__ = ["Started", "cluster_config", "load_cluster", "spawner", "start_detached", "up"]


def load_cluster(path: str | os.PathLike[str], params: Mapping[str, Any] | None = None) -> ClusterConfig:
    """A cluster file, parsed and checked as `up` does (`ConfigError` lists every problem), with
    `params` over its `params:` (as `up --set` gives them)."""
    from tfctl.config.loader import load_config

    return load_config(Path(path), params)


def cluster_config(cluster: str | os.PathLike[str] | ClusterConfig, params: Mapping[str, Any] | None) -> ClusterConfig:
    """A cluster file's path, or one `load_cluster` parsed, with `params` over its `params:` (a
    parsed one is parsed again with them: it counts as its file for every rule of runs)."""
    if isinstance(cluster, (str, os.PathLike)):
        return load_cluster(cluster, params)
    if params:
        from tfctl.config.loader import parse_config

        return parse_config(cluster.source, cluster.path, params)
    return cluster


def up(
    cluster: str | os.PathLike[str] | ClusterConfig,
    *,
    detach: bool = True,
    params: Mapping[str, Any] | None = None,
    resume: str | None = None,
    accept_new_host_keys: bool = False,
    progress: Callable[[Event], None] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> Run:
    """Start a run of `cluster` (a cluster file's path, or one `load_cluster` parsed: it counts as
    that file for the one-live-run rule and for `list_runs`). Detached (the default), it returns
    once every task runs, a watcher process ending the run when its job is done; attached, it
    follows the run to its end on this thread (a KeyboardInterrupt stops the run, then
    propagates). `resume`: a run id to continue from its checkpoints ("" for the file's newest
    run). `params`: values for the file's `params:` (as `up --set`; a parsed cluster is parsed
    again with them). `progress` hears what `tfctl up` prints: the start's steps and, attached, every line.
    Raises `TfctlError` (`ConfigError`, `StartupError`, ...) with what to do about it."""
    from tfctl.backends.base import backend_for
    from tfctl.controller.verbs import up as verbs

    config = cluster_config(cluster, params)
    store = RunStore(None if home is None else Path(home))
    tell = progress or (lambda _event: None)

    def said(who: str, message: str) -> None:
        tell(Event(EventKind.PROGRESS, who, message))

    resumes = None if resume is None else verbs.resumed_run(store, config, resume)
    elsewhere = backend_for(config.backend).run_elsewhere(
        config, detach, lambda line: said("", line), lambda line: said("", line), abandoner(store), resumes
    )
    if elsewhere is not None:
        return _started_elsewhere(store, config, elsewhere)
    cleared = verbs.ensure_no_live_run(store, config)
    if detach and backend_for(config.backend).waiting_for is None:
        return start_detached(store, config, spawner(store, accept_new_host_keys), said, cleared, resumes)
    return _start_here(store, config, said, tell, cleared, resumes, detach, accept_new_host_keys)


def abandoner(store: RunStore) -> Callable[[str], None]:
    """What ends a run whose queued next allocation a Ctrl-C cancelled: nobody else would."""
    from tfctl.engine.clock import REAL_CLOCK
    from tfctl.runs import transitions
    from tfctl.supervisor.protocol import RunState

    def abandoned(run_id: str) -> None:
        from tfctl.controller.live.tracked import close_trackers, say_to_stderr

        why = "interrupted while its next allocation was queued"
        transitions.apply(store, run_id, transitions.end_if_active(RunState.STOPPED, why, REAL_CLOCK.time()))
        close_trackers(store, run_id, say_to_stderr)

    return abandoned


def start_detached(
    store: RunStore,
    config: ClusterConfig,
    starter: Starter,
    progress: Progress,
    cleared: str | None,
    resumes: str | None,
    announce: Callable[[Draft], None] = lambda _run: None,
) -> Run:
    """`up -d` of a backend that never waits to acquire hosts: the run recorded (so a `down`
    typed at once finds it and stops its start), its watcher-to-be started (`starter`), told
    of (`announce`) while the tasks start, and its progress relayed. A KeyboardInterrupt stops
    the start and propagates once everything started is stopped (or, come as the tasks ran
    already, is too late: the run is returned)."""
    from tfctl.controller.live import driver, watcher
    from tfctl.controller.verbs import up as verbs
    from tfctl.runs import transitions
    from tfctl.runs.record import ControllerKind

    run = verbs.acquire(store, config, progress, resumes)  # (a pool says where it placed the run)
    transitions.claim(store, run.record, cleared)
    run_id = run.record.run_id
    try:
        started = starter(run)
    except OSError as e:  # nothing started anywhere: the run as if never asked for
        transitions.forget(store, run_id)
        raise TfctlError(
            f"cannot start the run's watcher: {e.strerror}", hint="see that this machine can start processes"
        ) from None
    except BaseException:
        transitions.forget(store, run_id)
        raise
    transitions.apply(
        store, run_id, transitions.take_control(watcher.controller_of(started.pid, ControllerKind.WATCHER))
    )
    with started.reports:
        try:
            announce(run)
            final = relay(started.reports, progress)
        except KeyboardInterrupt:
            with contextlib.suppress(ProcessLookupError):  # (gone and reaped already)
                os.kill(started.pid, signal.SIGTERM)
            final = relay(started.reports, progress)
    if final.get("gone") and store.exists(run_id):  # killed before it said how the start went
        started.reap()  # reaped: it no longer counts as running
        final["error"] = driver.resume(store, store.load(run_id)) or final["error"]
    if "error" in final:
        raise reported_error(final)
    if "running" not in final:
        raise KeyboardInterrupt
    return Run(run_id, store.home)  # (running before the interrupt reached it: a `status` gives it a new watcher)


def reported_error(final: dict[str, Any]) -> TfctlError:
    """The error the watcher reported, as the class it was (`StartupError`, `HostError`, ...)
    where that is one of tfctl's, so a caller catches it as such; its exit code as it said."""
    from tfctl import errors

    kind = getattr(errors, str(final.get("kind")), None)
    cls = kind if isinstance(kind, type) and issubclass(kind, TfctlError) else TfctlError
    error = cls.__new__(cls)  # (not its constructor: a ConfigError or HostError is built from parts)
    TfctlError.__init__(error, final["error"], final.get("hint"))
    error.exit_code = final.get("exit_code", error.exit_code)
    return error


def _start_here(
    store: RunStore,
    config: ClusterConfig,
    said: Progress,
    tell: Callable[[Event], None],
    cleared: str | None,
    resumes: str | None,
    detach: bool,
    accept_new_host_keys: bool,
) -> Run:
    """Acquire and start in this process; detached, a watcher process then takes the run over;
    attached, this thread follows it to its end, stopping it if interrupted."""
    from tfctl.controller.live import driver, launch, watcher
    from tfctl.controller.verbs import down
    from tfctl.controller.verbs import up as verbs

    run = verbs.acquire(store, config, said, resumes)
    cluster = launch.launch(store, run, said, accept_new_host_keys, detach, cleared=cleared)
    handle = Run(cluster.record.run_id, store.home)

    def on_lines(batch: list[tuple[str, str]]) -> None:
        for task, line in batch:
            tell(Event(EventKind.LINE, task, line))

    with cluster:
        if detach:
            watcher.spawn_watcher(store, cluster.record)
            return handle
        try:
            driver.attach(store, cluster, on_lines)
            return handle
        except KeyboardInterrupt:
            pass
    down.down(store, store.load(handle.id), None)  # interrupted: nothing is left running
    raise KeyboardInterrupt


def _started_elsewhere(store: RunStore, config: ClusterConfig, code: int) -> Run:
    """A run whose controller runs in a batch job: the newest run of the file, once that job
    said its tasks run (detached) or the run ended (attached)."""
    latest = store.latest(config.path)
    if code != 0 and (latest is None or latest.active):
        raise TfctlError(f"the run's controller ended with exit code {code}", hint="its output is in its batch log")
    if latest is None:
        raise UsageError(f"no run of {config.path} was recorded", hint="its output is in its batch log")
    return Run(latest.run_id, store.home)
