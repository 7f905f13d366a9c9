"""What the run store keeps of a sweep: its trials' parameters, how many run at once, who drives
it, and the trials that could not become a run. The trials' runs are ordinary run records
naming the sweep (`RunRecord.sweep`, `.trial`), so every verb works on them as on any run.

Layout: $TFCTL_HOME/sweeps/<sweep_id>/sweep.json, beside it the cluster file as the sweep read
it (every trial, also one started after the file was edited, runs that text). The sweep's
driver is the one writer of sweep.json while it lives; whoever finds it dead takes over.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import tempfile
from typing import Any, ClassVar, Mapping

from tfctl.errors import TfctlError, UsageError
from tfctl.runs.record import Controller, RunRecord, TrackerRun
from tfctl.runs.store import RunStore, new_run_id
from tfctl.supervisor.records import Wire, field, record

CLUSTER_FILE = "cluster.yaml"


class SweepState(str, enum.Enum):
    """A whole sweep's state."""

    RUNNING = "running"  # trials are started as room frees, or run
    DONE = "done"  # every trial ended (succeeded or, retries spent, failed)
    STOPPED = "stopped"  # `down --sweep` stopped it; trials not started never will be

    def __str__(self) -> str:
        return self.value

    @property
    def is_final(self) -> bool:
        return self is not SweepState.RUNNING


@record
class SweepRecord(Wire):
    """One sweep."""

    NESTED: ClassVar[Mapping[str, Any]] = {"driver": ("one", Controller), "tracking": ("tuple", TrackerRun)}
    ENUMS: ClassVar[Mapping[str, Any]] = {"state": SweepState}
    TUPLES: ClassVar[tuple[str, ...]] = ("trials",)

    sweep_id: str
    cluster_name: str
    cluster_file: str
    created_at: float
    trials: tuple[dict[str, Any], ...]  # each trial's parameters, in trial order
    overrides: dict[str, str] = field(default_factory=dict)  # `sweep --set NAME=TEXT`, for every trial
    max_parallel: int = 1
    retries: int = 0
    state: SweepState = SweepState.RUNNING
    driver: Controller | None = None  # the process starting its trials while it is running
    errors: dict[str, list[str]] = field(default_factory=dict)  # trial (as text) -> why its starts made no run
    ended_at: float | None = None
    reason: str | None = None
    resumed_at: float | None = None  # its newest `sweep --resume`: trials stopped before it start again
    tracking: tuple[TrackerRun, ...] = ()  # the tracker runs its trials' runs are nested in (`tracking:`)


def new_sweep_id(cluster_name: str, now: float | None = None) -> str:
    return new_run_id(f"{cluster_name}-sweep", now)


class SweepStore:
    """Sweep records beside a run store's runs, under its lock. Constructing it touches nothing."""

    def __init__(self, runs: RunStore) -> None:
        self.runs = runs
        self.dir = runs.home / "sweeps"

    def create(self, sweep: SweepRecord, text: str) -> None:
        """A new sweep and the cluster file text its trials run."""
        with self.runs.lock():
            self.dir.mkdir(mode=0o700, exist_ok=True)
            try:
                (self.dir / sweep.sweep_id).mkdir(mode=0o700)
            except FileExistsError:
                raise UsageError(f"sweep id {sweep.sweep_id} is already taken", hint="run the command again") from None
            kept = self.dir / sweep.sweep_id / CLUSTER_FILE
            kept.write_text(text, encoding="utf-8")
            kept.chmod(0o600)
            self._write(sweep)

    def save(self, sweep: SweepRecord) -> None:
        with self.runs.lock():
            self._write(sweep)

    def _write(self, sweep: SweepRecord) -> None:
        where = self.dir / sweep.sweep_id
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".sweep.json.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(sweep.to_wire(), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, where / "sweep.json")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def load(self, sweep_id: str) -> SweepRecord:
        path = self.dir / sweep_id / "sweep.json"
        try:
            return SweepRecord.from_wire(json.loads(path.read_text()))
        except FileNotFoundError:
            raise UsageError(
                f"no sweep {sweep_id!r} in {self.dir}", hint="`tfctl sweep status` shows the newest"
            ) from None
        except (ValueError, TypeError, KeyError) as e:
            raise TfctlError(f"the record of sweep {sweep_id} is damaged ({path}: {e})", hint="remove it") from None

    def text(self, sweep_id: str) -> str:
        """The cluster file as the sweep read it."""
        return (self.dir / sweep_id / CLUSTER_FILE).read_text(encoding="utf-8")

    def all(self) -> list[SweepRecord]:
        """Every sweep, oldest first (a damaged record is skipped: `load` names it when asked)."""
        found = []
        for path in self.dir.glob("*/sweep.json") if self.dir.is_dir() else ():
            with contextlib.suppress(ValueError, TypeError, KeyError, OSError):
                found.append(SweepRecord.from_wire(json.loads(path.read_text())))
        return sorted(found, key=lambda s: s.created_at)

    def resolve(self, sweep_id: str | None, cluster_file: str) -> SweepRecord:
        """The sweep named, else the cluster file's newest."""
        if sweep_id:
            return self.load(sweep_id)
        mine = [s for s in self.all() if s.cluster_file == cluster_file]
        if not mine:
            raise UsageError(f"no sweep of {cluster_file} yet", hint=f"start one with `tfctl -f {cluster_file} sweep`")
        return mine[-1]

    def trial_runs(self, sweep: SweepRecord) -> dict[int, list[RunRecord]]:
        """Each trial's runs (its attempts), oldest first."""
        runs: dict[int, list[RunRecord]] = {i: [] for i in range(len(sweep.trials))}
        for run in self.runs.all():
            if run.sweep == sweep.sweep_id and run.trial in runs:
                runs[run.trial].append(run)
        return runs
