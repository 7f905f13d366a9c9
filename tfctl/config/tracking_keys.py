"""Validating `tracking:` (`tracking.py` holds what it becomes): the trackers' keys, and that no
`env:` sets a variable tfctl gives the tasks while a tracker is on."""

from __future__ import annotations

import re
from typing import Any, Mapping

from tfctl.config.base import INVALID, Doc, Section, _choice, _string
from tfctl.config.tracking import WANDB_MODES, MlflowSettings, TrackingSettings, WandbSettings

EXAMPLE = "tracking: {mlflow: {uri: http://127.0.0.1:5000, experiment: mnist}}"
_URL = re.compile(r"https?://[^\s/]+(/\S*)?")


def _uri(doc: Doc, path: str, value: Any) -> Any:
    text = _string(doc, path, value, "uri: http://127.0.0.1:5000")
    if text is not INVALID and _URL.fullmatch(text) and "@" in text.split("/")[2]:
        return doc.problem(
            path,
            "names a user or password: it would be kept in every run's record and every task's environment",
            "give the address alone, and the credentials as MLFLOW_TRACKING_TOKEN (or _USERNAME and _PASSWORD)",
        )
    if text is INVALID or _URL.fullmatch(text):
        return text.rstrip("/")
    return doc.problem(
        path,
        f"`{text}` is not an http(s) address of a tracking server",
        "e.g. `uri: http://127.0.0.1:5000` (start one with `mlflow server`); tfctl speaks its REST API",
    )


def _text(example: str) -> Any:
    return lambda doc, path, value: _string(doc, path, value, example)


_mlflow = Section(
    {"uri": _uri, "experiment": _text("experiment: mnist")},
    MlflowSettings,
    "mlflow: {uri: http://127.0.0.1:5000, experiment: mnist}",
    required={"uri": "add `uri: http://HOST:5000`, the tracking server's address"},
)
_wandb = Section(
    {
        "project": _text("project: mnist"),
        "entity": _text("entity: my-team"),
        "mode": _choice(WANDB_MODES, "`online` (W&B's default), `offline` (files on disk) or `disabled`"),
    },
    WandbSettings,
    "wandb: {project: mnist, mode: offline}",
    required={"project": "add `project: NAME`, the W&B project the runs go to"},
)


class _Trackers(Section):
    """`tracking:`, a section of trackers with at least one in it."""

    def __call__(self, doc: Doc, path: str, value: Any) -> Any:
        settings = super().__call__(doc, path, value)
        if settings is INVALID or settings.mlflow or settings.wandb:
            return settings
        return doc.problem(path, "names no tracker", f"give `mlflow:` or `wandb:`, e.g. `{EXAMPLE}`")


tracking = _Trackers({"mlflow": _mlflow, "wandb": _wandb}, TrackingSettings, EXAMPLE)


def check_env(doc: Doc, values: Mapping[str, Any]) -> None:
    """An `env:` (the file's or a job's) may not set what the trackers tell the tasks."""
    settings = values.get("tracking")
    if not isinstance(settings, TrackingSettings):
        return
    taken = set(settings.variables())
    envs: dict[str, Any] = {"env": values.get("env")}
    jobs = values.get("jobs")
    if isinstance(jobs, Mapping):
        envs.update({f"jobs.{name}.env": job.env for name, job in jobs.items()})
    for where, env in envs.items():
        if not isinstance(env, Mapping):
            continue
        for name in sorted(taken & set(env)):
            doc.problem(
                f"{where}.{name}",
                f"`{name}` is set by tfctl while `tracking:` is on",
                "remove it: each task is told its tracker run by tfctl, the same across resume and resubmission",
                at=doc.key_nodes.get(f"{where}.{name}"),
            )


KEY_DOCS: dict[str, str] = {
    "tracking": "The experiment tracker every run logs into: one tracker run per tfctl run; off unless given.",
    "tracking.mlflow": "An MLflow tracking server, reached over its REST API from this machine.",
    "tracking.mlflow.uri": "The server's address, e.g. `http://127.0.0.1:5000`; given to tasks as MLFLOW_TRACKING_URI.",
    "tracking.mlflow.experiment": "The experiment the runs go to (made if missing); unset: the cluster's name.",
    "tracking.wandb": "A W&B project: tasks get WANDB_RUN_ID and the rest; their own `wandb` makes the run.",
    "tracking.wandb.project": "The W&B project.",
    "tracking.wandb.entity": "The W&B team or user; unset: W&B's default.",
    "tracking.wandb.mode": "`online`, `offline` (files on disk, `wandb sync` later) or `disabled`; unset: online.",
}
