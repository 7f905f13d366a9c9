"""`tfctl sweep`: make a sweep's trials, drive them (each a detached run of its own, at most
`max_parallel` at once, a failure given its retries), stop them, and read their results.

The decisions are `engine/sweeping.py`'s; this is the shell that reads the records, asks it,
and starts what it says. The driver is the one writer of the sweep's record while it lives:
killed, the trials it started go on under their own watchers, and `sweep --resume` (or the
next driver) takes over where the records say it stood.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from tfctl.cluster.answers import StopReport
from tfctl.config.loader import load_config, parse_config
from tfctl.config.model import CHOSEN_AT_START, ClusterConfig
from tfctl.config.sweep import TrialOf
from tfctl.config.sweep_flags import flagged_spec
from tfctl.controller.live import tracked
from tfctl.engine import sweeping
from tfctl.engine.clock import Cancel, Clock
from tfctl.engine.sweeping import TrialSeen, TrialState
from tfctl.errors import ConfigError, ConfigProblem, TfctlError, UsageError
from tfctl.runs.record import Controller, RunRecord, params_text
from tfctl.runs.sweeps import SweepRecord, SweepState, SweepStore, new_sweep_id
from tfctl.supervisor.states import RunState

STOP_PATIENCE = 30.0  # seconds `down --sweep` waits for the driver it signalled to stop its trials


@dataclass(frozen=True)
class TrialEvent:
    """A trial whose state changed, as the follower prints it."""

    index: int
    state: TrialState
    params: Mapping[str, Any]
    run_id: str | None
    why: str | None  # how its newest run ended, or why none could start


@dataclass(frozen=True)
class TrialResult:
    """One row of `sweep status`."""

    index: int
    params: Mapping[str, Any]
    state: TrialState
    run_id: str | None  # its newest run
    runs: tuple[str, ...]  # all of them, oldest first
    metrics: Mapping[str, Any]  # name -> {"value", "step", "task"}, as the newest run's result
    wall_seconds: float | None
    gpu_hours: float | None
    why: str | None

    def state_text(self) -> str:
        """`succeeded`; a failed trial with its cause: `failed: worker:0 exited with code 3`."""
        return f"failed: {self.why}" if self.why is not None and self.state is TrialState.FAILED else self.state.value

    def to_json(self) -> dict[str, Any]:
        return {
            "trial": self.index,
            "run_id": self.run_id,
            "runs": list(self.runs),
            "params": dict(self.params),
            "state": self.state.value,
            "metrics": {name: {"value": m.get("value"), "step": m.get("step")} for name, m in self.metrics.items()},
            "wall_seconds": self.wall_seconds,
            "gpu_hours": self.gpu_hours,
            "why": self.why,
        }


def create(
    sweeps: SweepStore,
    path: Path,
    given: Mapping[str, Any],
    max_parallel: int | None,
    now: float,
    say: Callable[[str], None] = lambda _line: None,
    flags: Mapping[str, Any] | None = None,
) -> SweepRecord:
    """A new sweep of the cluster file at `path` (`given`: `--set` values over its `params:` for
    every trial), its trials made and each checked as `up` would check its run, so a trial
    that cannot start is refused here, before any other starts. With `tracking:` on, the runs
    its trials' runs nest in are made (`say` hears of them, and of a tracker that refused).
    `flags`: the command line's `--grid`/`--zip`/`--random` (`sweep_flags.section`), in place of
    what the file's `sweep:` varies."""
    config = load_config(path, given)
    spec = flagged_spec(path, flags, config.sweep, config.params) if flags else config.sweep
    if spec is None:
        raise UsageError(
            f"{path} has no `sweep:`",
            hint="add one, e.g. `sweep: {grid: {lr: [0.1, 0.01]}}` (with `lr` in `params:`), "
            "or give the trials as flags: tfctl sweep --grid lr=0.1,0.01",
        )
    parallel = spec.max_parallel if max_parallel is None else max_parallel
    fixed = sorted({str(a) for _, _, a in config.tasks() if a.port != CHOSEN_AT_START})
    if parallel > 1 and fixed:
        raise ConfigError(
            [
                ConfigProblem(
                    path,
                    None,
                    None,
                    "sweep.max_parallel",
                    f"{parallel} trials at once would share ports: the file fixes {', '.join(fixed[:3])}"
                    + (" ..." if len(fixed) > 3 else ""),
                    "leave the ports out of `jobs:` (`worker: [host1, host2]`: each run gets free ones), "
                    "or run one trial at a time (`max_parallel: 1`)",
                )
            ]
        )
    trials = spec.trials()
    texts = {name: text for name, (_value, text) in given.items()} if given else {}
    for index, params in enumerate(trials):
        try:
            parse_config(config.source, path, {**given, **params})
        except ConfigError as e:
            raise ConfigError(
                [
                    dataclasses.replace(p, message=f"trial {index} ({params_text(params)}): {p.message}")
                    for p in e.problems
                ]
            ) from None
    sweep_id = new_sweep_id(config.name, now)
    sweep = SweepRecord(
        sweep_id=sweep_id,
        cluster_name=config.name,
        cluster_file=str(path.resolve()),
        created_at=now,
        trials=tuple(trials),
        overrides=texts,
        max_parallel=parallel,
        retries=spec.retries,
        tracking=tracked.open_sweep(config, sweep_id, now, say) if config.tracking else (),
    )
    sweeps.create(sweep, config.source)
    return sweep


def trial_config(sweeps: SweepStore, sweep: SweepRecord, index: int) -> ClusterConfig:
    """Trial `index`'s cluster: the sweep's text with the sweep's `--set` and the trial's values."""
    from tfctl.config.params import overrides

    given = {**overrides([f"{k}={v}" for k, v in sweep.overrides.items()]), **sweep.trials[index]}
    config = parse_config(sweeps.text(sweep.sweep_id), Path(sweep.cluster_file), given)
    return dataclasses.replace(config, trial=TrialOf(sweep.sweep_id, index))


def seen(sweep: SweepRecord, runs: Mapping[int, list[RunRecord]]) -> tuple[TrialSeen, ...]:
    """The trials as the engine reads them."""
    return tuple(
        TrialSeen(
            i,
            tuple(sweeping.Attempt(r.run_id, r.state, r.cut_off, r.ended_at) for r in runs.get(i, [])),
            len(sweep.errors.get(str(i), [])),
        )
        for i in range(len(sweep.trials))
    )


def drive(
    sweeps: SweepStore,
    sweep_id: str,
    controller: Controller,
    clock: Clock,
    cancel: Cancel,
    tell: Callable[[TrialEvent], None],
    start: Callable[[ClusterConfig, str | None], str],
    resuming: bool = False,
) -> SweepRecord:
    """Drive the sweep until it is over: look, start what `sweeping.step` says, wait. `start`
    (a config and the run it resumes -> the new run's id) starts a trial detached, as `up -d`
    (`tfctl.up(detach=True)`); a trial
    whose start is refused keeps the error. A `cancel` stops the sweep: nothing more starts
    and every running trial is stopped, proved as `down` proves it. `resuming`: as `sweep
    --resume`, its stopped trials and those not started go on."""
    from tfctl.controller.live import driver

    sweep = _taken(sweeps, sweeps.load(sweep_id), controller)
    if resuming:
        _resumed(sweeps, sweep, clock.time())
    before: tuple[TrialState, ...] = ()
    while True:
        sweep = sweeps.load(sweep_id)
        if cancel.is_set() and sweep.state is SweepState.RUNNING:
            stop(sweeps, sweep, clock.time())
            sweep = sweeps.load(sweep_id)
        runs = sweeps.trial_runs(sweep)
        for attempts in runs.values():
            if attempts and attempts[-1].active and driver.resume(sweeps.runs, attempts[-1]):
                attempts[-1] = sweeps.runs.load(attempts[-1].run_id)  # a new watcher, or its cut-off start ended
        decided = sweeping.step(
            seen(sweep, runs), sweep.max_parallel, sweep.retries, sweep.state.is_final, sweep.resumed_at
        )
        for index, state in sweeping.changes(before, decided.states):
            tell(_event(sweep, runs, index, state))
        before = decided.states
        if decided.start:
            sweep, before = _started(sweeps, sweep, runs, decided.start, start, tell, before)
        if decided.over:
            return _ended(sweeps, sweep, decided.states, clock.time())
        if not decided.start:
            clock.wait(cancel, decided.requeue_after)


def _resumed(sweeps: SweepStore, sweep: SweepRecord, now: float) -> SweepRecord:
    """The sweep running again (`sweep --resume`): its trials not started, and those stopped
    with it, start (again, continuing their files); its failed trials stay failed."""
    sweep = sweep.replace(state=SweepState.RUNNING, ended_at=None, reason=None, resumed_at=now)
    sweeps.save(sweep)
    return sweep


def _started(
    sweeps: SweepStore,
    sweep: SweepRecord,
    runs: Mapping[int, list[RunRecord]],
    orders: tuple[sweeping.Start, ...],
    start: Callable[[ClusterConfig, str | None], str],
    tell: Callable[[TrialEvent], None],
    states: tuple[TrialState, ...],
) -> tuple[SweepRecord, tuple[TrialState, ...]]:
    """The trials `orders` names, started at once (each start waits for its tasks to run), each
    told of as it runs; a start refused before it recorded a run (`runs`: those before) is kept
    with the sweep, as one failed attempt."""
    from concurrent.futures import ThreadPoolExecutor

    def one(order: sweeping.Start) -> tuple[int, str | None, str | None]:
        try:
            return order.index, start(trial_config(sweeps, sweep, order.index), order.resumes), None
        except TfctlError as e:
            return order.index, None, e.message

    seen = list(states)
    errors = dict(sweep.errors)
    with ThreadPoolExecutor(max_workers=len(orders), thread_name_prefix="trial") as pool:
        for index, run_id, error in pool.map(one, orders):
            if run_id is not None:
                seen[index] = TrialState.RUNNING
                tell(TrialEvent(index, TrialState.RUNNING, sweep.trials[index], run_id, None))
            elif len(sweeps.trial_runs(sweep)[index]) == len(runs.get(index, [])):
                errors[str(index)] = [*errors.get(str(index), []), error or "its start was refused"]
    if errors != sweep.errors:
        sweep = sweep.replace(errors=errors)
        sweeps.save(sweep)
    return sweep, tuple(seen)


def _taken(sweeps: SweepStore, sweep: SweepRecord, controller: Controller) -> SweepRecord:
    """The sweep driven by this process: refused while another driver of it lives."""
    from tfctl.controller.live.watcher import is_running

    other = sweep.driver
    if other is not None and other.pid != controller.pid and other.host == controller.host and is_running(other):
        raise UsageError(
            f"sweep {sweep.sweep_id} is driven by pid {other.pid} already",
            hint=f"see it: tfctl sweep status {sweep.sweep_id}; stop it: tfctl down --sweep {sweep.sweep_id}",
        )
    taken = sweep.replace(driver=controller)
    sweeps.save(taken)
    return taken


def _ended(sweeps: SweepStore, sweep: SweepRecord, states: tuple[TrialState, ...], now: float) -> SweepRecord:
    failed = [str(i) for i, s in enumerate(states) if s is TrialState.FAILED]
    if sweep.state is SweepState.RUNNING:
        reason = f"{len(states)} trials, failed: {', '.join(failed)}" if failed else f"{len(states)} trials succeeded"
        sweep = sweep.replace(state=SweepState.DONE, ended_at=now, reason=reason)
    sweep = sweep.replace(driver=None)
    sweeps.save(sweep)
    tracked.close_sweep(sweep.tracking, sweep.state.value, sweep.ended_at or now, tracked.say_to_stderr)
    return sweep


def _event(sweep: SweepRecord, runs: Mapping[int, list[RunRecord]], index: int, state: TrialState) -> TrialEvent:
    newest = runs[index][-1] if runs.get(index) else None
    errors = sweep.errors.get(str(index), [])
    why = errors[-1] if errors and (newest is None or state is TrialState.FAILED and not newest.reason) else None
    return TrialEvent(
        index,
        state,
        sweep.trials[index],
        None if newest is None else newest.run_id,
        why or (newest.reason if newest is not None and state.is_final else None),
    )


def stop(sweeps: SweepStore, sweep: SweepRecord, now: float) -> list[tuple[RunRecord, StopReport | None]]:
    """Stop the sweep: its driver first (so nothing more starts; it stops the trials itself and
    is waited for), then every trial still running, each as `down` stops a run. Every trial
    that was running, as its record then says, with what this stop proved of it (None: its
    driver stopped it, and its record says what that proved)."""
    from tfctl.controller.live.watcher import end_process, is_running
    from tfctl.controller.verbs.down import down

    running = [r for attempts in sweeps.trial_runs(sweep).values() for r in attempts if r.active]
    driver = sweep.driver
    if driver is not None and driver.pid != os.getpid() and is_running(driver):
        try:
            os.kill(driver.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        end_process(driver, STOP_PATIENCE)
    sweep = sweeps.load(sweep.sweep_id)
    if sweep.state is SweepState.RUNNING:
        sweep = sweep.replace(state=SweepState.STOPPED, ended_at=now, reason="tfctl down --sweep")
        sweeps.save(sweep)
        tracked.close_sweep(sweep.tracking, sweep.state.value, now, tracked.say_to_stderr)
    stopped: list[tuple[RunRecord, StopReport | None]] = []
    every = running + [r for a in sweeps.trial_runs(sweep).values() for r in a if r.active and r not in running]
    # Those waiting in a queue first: a GPU the others free must not start one of them meanwhile.
    for run in sorted(every, key=lambda r: r.state is not RunState.QUEUED):
        record = sweeps.runs.load(run.run_id)
        report = down(sweeps.runs, record, None)[0] if record.active else None
        stopped.append((sweeps.runs.load(run.run_id), report))
    return stopped


def results(sweeps: SweepStore, sweep: SweepRecord) -> list[TrialResult]:
    """Every trial's row: its parameters, state, the newest run's metrics and cost."""
    runs = sweeps.trial_runs(sweep)
    states = sweeping.step(seen(sweep, runs), sweep.max_parallel, sweep.retries, True, sweep.resumed_at).states
    rows = []
    for index, state in enumerate(states):
        attempts = runs.get(index, [])
        newest = attempts[-1] if attempts else None
        total = ((newest.accounting or {}).get("total") or {}) if newest is not None else {}
        event = _event(sweep, runs, index, state)
        rows.append(
            TrialResult(
                index,
                sweep.trials[index],
                state,
                None if newest is None else newest.run_id,
                tuple(r.run_id for r in attempts),
                dict((newest.result or {}) if newest is not None else {}),
                total.get("wall_seconds"),
                total.get("gpu_hours"),
                event.why,
            )
        )
    return rows


def ranked(rows: list[TrialResult], metric: str | None, smallest: bool = False) -> list[TrialResult]:
    """`rows` best first by `metric` (the largest, or the `smallest`), trials without it last,
    in trial order; as they are without a metric."""
    if metric is None:
        return rows

    def key(row: TrialResult) -> tuple[bool, float]:
        value = (row.metrics.get(metric) or {}).get("value")
        if not isinstance(value, (int, float)):
            return (True, 0.0)
        return (False, value if smallest else -value)

    return sorted(rows, key=key)


def best_of(rows: list[TrialResult], metric: str | None) -> int | None:
    """The best trial of `ranked(rows, metric)`: the first, if it has the metric at all."""
    return rows[0].index if metric and rows and metric in rows[0].metrics else None


def metric_text(row: TrialResult, name: str) -> str:
    """`0.97 @600`: the trial's final `name` and the step it came at; "" for none."""
    m = row.metrics.get(name)
    if not m or m.get("value") is None:
        return ""
    step = f" @{m['step']}" if m.get("step") is not None else ""
    return f"{m['value']:g}{step}"
