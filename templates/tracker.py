"""The chief's numbers into the experiment tracker's run tfctl made for this run (`tracking:` in
cluster.yaml); `tfctl init` puts this file beside every template's train.py.

tfctl tells every task its tracker run (MLFLOW_TRACKING_URI and MLFLOW_RUN_ID, or WANDB_RUN_ID)
and which task is the chief (TFCTL_CHIEF=1): only the chief logs, into that run, so a resumed or
resubmitted run goes on in the same one. MLflow is spoken to over its REST API with the standard
library, on a thread of its own: training never waits for the server, and a server that stops
answering costs one line and the points it missed. W&B is logged by `wandb` itself where it is
installed on the host. Without `tracking:`, `open_tracker` returns None and nothing is logged.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.request
from typing import Callable, Mapping

TIMEOUT = 5.0  # seconds the server has for one batch
FLUSH_WAIT = 10.0  # seconds `close` waits for the points still queued


class MlflowLog:
    """Batches of metrics sent to one MLflow run from a thread; the first failure is said once."""

    def __init__(self, uri: str, run_id: str, say: Callable[[str], None]) -> None:
        self.url = uri.rstrip("/") + "/api/2.0/mlflow/runs/log-batch"
        self.run_id = run_id
        self.say = say
        self.failed = False
        self.lost = 0
        self.points: queue.SimpleQueue[list[dict] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._send_all, daemon=True, name="tracker")
        self.thread.start()

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        at = int(time.time() * 1000)
        self.points.put([{"key": k, "value": float(v), "timestamp": at, "step": int(step)} for k, v in values.items()])

    def close(self) -> None:
        self.points.put(None)
        self.thread.join(FLUSH_WAIT)
        if self.lost:
            self.say(f"tracking: {self.lost} points were not logged (the server did not take them)")

    def _send_all(self) -> None:
        while (batch := self.points.get()) is not None:
            if self.failed:
                self.lost += len(batch)
                continue
            body = json.dumps({"run_id": self.run_id, "metrics": batch}).encode()
            request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT):
                    pass
            except Exception as error:  # refused, timed out, not HTTP at all: training goes on
                self.failed, self.lost = True, self.lost + len(batch)
                self.say(f"tracking: MLflow at {self.url} did not take the chief's metrics ({error}); not trying again")


class WandbLog:
    """W&B's own client, which reads the run's id, group and project from the environment; a
    failure of it (no API key, no network) is said once and logging stops, never training."""

    def __init__(self, run: object, say: Callable[[str], None]) -> None:
        self.run: object | None = run
        self.say = say

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        self._call("log", dict(values), step=step)

    def close(self) -> None:
        self._call("finish")

    def _call(self, name: str, *args: object, **kwargs: object) -> None:
        if self.run is None:
            return
        try:
            getattr(self.run, name)(*args, **kwargs)
        except Exception as error:
            self.run = None
            self.say(f"tracking: W&B failed ({error}); the chief logs nothing more to it")


def open_tracker(say: Callable[[str], None] = print) -> MlflowLog | WandbLog | None:
    """This task's tracker if it is the chief of a run with `tracking:`, else None."""
    env = os.environ
    if env.get("TFCTL_CHIEF") != "1":
        return None
    if env.get("MLFLOW_RUN_ID") and env.get("MLFLOW_TRACKING_URI"):
        return MlflowLog(env["MLFLOW_TRACKING_URI"], env["MLFLOW_RUN_ID"], say)
    if env.get("WANDB_RUN_ID"):
        try:
            import wandb
        except ImportError:
            say("tracking: wandb is not installed on this host (pip install wandb): the chief logs nothing to W&B")
            return None
        try:
            return WandbLog(wandb.init(), say)
        except Exception as error:  # no API key for an online run, no network: training goes on
            say(f"tracking: W&B could not start the run ({error}); the chief logs nothing to it")
            return None
    return None
