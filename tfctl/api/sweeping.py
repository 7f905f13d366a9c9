"""Sweeps from Python: `sweep` makes a cluster file's trials and leaves them to a driver
process, as `tfctl sweep -d` does (which calls it); the `Sweep` handle reads its trials and
results as plain lists of dicts (the rows of `sweep status --json`), waits for it, stops it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tfctl.api.handle import Timeout
from tfctl.runs.store import RunStore
from tfctl.runs.sweeps import SweepRecord, SweepStore

WAIT_EVERY = 1.0  # seconds between two looks of `Sweep.wait`


@dataclass(frozen=True)
class Sweep:
    """A sweep, by id and run store: nothing held, so it pickles and any thread may use it."""

    id: str
    home: Path

    @property
    def trials(self) -> list[dict[str, Any]]:
        """Each trial in order: `trial` (its index), `params`, `state` and its newest `run_id` (None: not started)."""
        return [{k: row[k] for k in ("trial", "params", "state", "run_id")} for row in self.results()]

    def results(self, sort_by: str | None = None, smallest: bool = False) -> list[dict[str, Any]]:
        """The trials as `tfctl sweep status --json` lists them (params, state, metrics, wall
        time, GPU-hours), ordered by metric `sort_by` when given, best first."""
        from tfctl.controller.verbs import sweep as verbs

        sweeps = self._sweeps()
        return [row.to_json() for row in verbs.ranked(verbs.results(sweeps, sweeps.load(self.id)), sort_by, smallest)]

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until every trial ended (or the sweep was stopped): `{"sweep", "state",
        "reason"}`; `Timeout` past `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            record = self._sweeps().load(self.id)
            if record.state.is_final:
                return {"sweep": record.sweep_id, "state": record.state.value, "reason": record.reason}
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"sweep {self.id} is still {record.state} after {timeout:g}s")
            time.sleep(WAIT_EVERY)

    def down(self) -> list[str]:
        """Stop the sweep: its driver, then every trial still running, as `down --sweep`; the
        ids of the trials' runs that were running."""
        from tfctl.controller.verbs import sweep as verbs

        sweeps = self._sweeps()
        return [run.run_id for run, _report in verbs.stop(sweeps, sweeps.load(self.id), time.time())]

    def _sweeps(self) -> SweepStore:
        return SweepStore(RunStore(self.home))


def sweep(
    cluster: str | os.PathLike[str],
    *,
    params: Mapping[str, Any] | None = None,
    max_parallel: int | None = None,
    home: str | os.PathLike[str] | None = None,
) -> Sweep:
    """Make the trials of the cluster file's `sweep:` (with `params` over its `params:` for every
    trial) and start a driver process that runs them, at most `max_parallel` at once (default:
    the file's); returns at once. A trial that cannot start is refused here (`ConfigError`)."""
    from tfctl.config.params import text_of
    from tfctl.controller.live.tracked import say_to_stderr
    from tfctl.controller.verbs import sweep as verbs

    sweeps = SweepStore(RunStore(None if home is None else Path(home)))
    given = {name: (value, text_of(value)) for name, value in (params or {}).items()}
    record = verbs.create(sweeps, Path(cluster), given, max_parallel, time.time(), say_to_stderr)
    spawn_driver(sweeps, record, resuming=False)
    return Sweep(record.sweep_id, sweeps.runs.home)


def spawn_driver(sweeps: SweepStore, record: SweepRecord, resuming: bool) -> int:
    """`tfctl _sweep` in its own session (a closed terminal does not stop it), logging beside
    the sweep's record; being nobody's child once its starter ends, it is reaped by init."""
    log_path = sweeps.dir / record.sweep_id / "driver.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfctl", "_sweep", "--id", record.sweep_id, *(["--resume"] if resuming else [])],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "TFCTL_HOME": str(sweeps.runs.home)},
        )
    return proc.pid
