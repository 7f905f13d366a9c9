"""W&B: the tasks' own `wandb.init()` makes the run, with the id, group and project tfctl gives
them (WANDB_RUN_ID, WANDB_RESUME=allow), so a resumed or resubmitted run continues it.

W&B has no REST API to write to without its library (and offline, no server at all): tfctl's
figures and the report reach the run only where `wandb` is installed on this machine, logged by
a child process (`wandb_log.py`) so the controller never imports it. Elsewhere the end says so,
and the tasks still had the run id.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict

from tfctl.config.tracking import TrackingSettings
from tfctl.errors import TrackingError
from tfctl.runs.record import TrackerRun
from tfctl.tracking.trackers import Ending, Opening, Tracker

LOG_TIMEOUT = 30.0  # seconds the child logging tfctl's figures may take: a `down` waits for the end
_ID = re.compile(r"[^A-Za-z0-9_-]")


def wandb_id(run_id: str) -> str:
    """The W&B run id of a tfctl run: its id in W&B's letters, at most 64 of them (a long one
    keeps its head and a hash of the whole, so two runs of one cluster never share one)."""
    plain = _ID.sub("-", run_id)
    if len(plain) <= 64:
        return plain
    return f"{plain[:55]}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


class Wandb(Tracker):
    kind = "wandb"
    title = "W&B"

    def __init__(self, project: str, entity: str | None, mode: str | None) -> None:
        self.project = project
        self.entity = entity or ""
        self.mode = mode or ""

    @classmethod
    def of_settings(cls, settings: TrackingSettings) -> Wandb | None:
        w = settings.wandb
        return None if w is None else cls(w.project, w.entity, w.mode)

    @classmethod
    def of_link(cls, link: TrackerRun) -> Wandb:
        return cls(link.experiment, link.entity, link.mode)

    def open(self, opening: Opening) -> TrackerRun:
        run_id = wandb_id(opening.run_id)
        return self._link(run_id, opening.group or opening.cluster)

    def open_parent(self, opening: Opening) -> TrackerRun:
        """A sweep is W&B's group of its trials: there is no run of its own to make."""
        return self._link("", opening.run_id)

    def _link(self, run_id: str, group: str) -> TrackerRun:
        online = self.mode in ("", "online")
        url = (
            f"https://wandb.ai/{self.entity}/{self.project}/runs/{run_id}" if online and self.entity and run_id else ""
        )
        return TrackerRun(
            kind=self.kind,
            run_id=run_id,
            url=url,
            experiment=self.project,
            group=group,
            entity=self.entity,
            mode=self.mode,
        )

    def reopen(self, link: TrackerRun, run_id: str) -> None:
        """Nothing to tell: the tasks resume the run by its id (WANDB_RESUME=allow)."""

    def close(self, link: TrackerRun, ending: Ending) -> list[str]:
        if importlib.util.find_spec("wandb") is None:
            return [
                "tfctl's figures and the report: the wandb library is not installed on this machine "
                "(pip install 'tfctl[tracking]'); the tasks were given the run's id"
            ]
        if self.mode == "disabled":
            return []
        job = {"link": link.to_wire(), "ending": asdict(ending)}
        env = {**os.environ, **self.task_env(link), "WANDB_DIR": ending.folder, "WANDB_SILENT": "true"}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "tfctl.tracking.wandb_log"],
                input=json.dumps(job).encode(),
                env=env,
                capture_output=True,
                timeout=LOG_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise TrackingError(f"W&B did not take tfctl's figures within {LOG_TIMEOUT:g}s") from None
        except OSError as error:
            raise TrackingError(f"W&B's logging could not start: {error.strerror}") from None
        if done.returncode != 0:
            last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no words"]
            raise TrackingError(f"W&B refused tfctl's figures: {last[0][:300]}")
        return []

    def close_parent(self, link: TrackerRun, state: str, at: float) -> None:
        """A group ends with its last run."""

    def task_env(self, link: TrackerRun) -> dict[str, str]:
        env = {
            "WANDB_RUN_ID": link.run_id,
            "WANDB_RESUME": "allow",
            "WANDB_PROJECT": link.experiment,
            "WANDB_NAME": link.run_id,
            "WANDB_RUN_GROUP": link.group,
            "WANDB_ENTITY": link.entity,
            "WANDB_MODE": link.mode,
        }
        return {name: value for name, value in env.items() if value}
