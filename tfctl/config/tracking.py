"""The `tracking:` section as runs read it (`tracking_keys.py` validates it): the experiment
tracker each run of the file logs into, one tracker run per tfctl run (`tfctl/tracking/` opens
it, the tasks are told of it by their environment).

Off unless given. The variables a tracker gives the tasks are tfctl's while it is on: an `env:`
that sets one is refused, so which value a task sees is never a matter of precedence.
"""

from __future__ import annotations

from dataclasses import dataclass

WANDB_MODES = ("online", "offline", "disabled")  # as W&B's own WANDB_MODE spells them
# What the tasks are told, per tracker; `TFCTL_CHIEF` says which task logs ("1" on that one).
MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")
WANDB_ENV = (
    "WANDB_RUN_ID",
    "WANDB_RESUME",
    "WANDB_RUN_GROUP",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "WANDB_MODE",
    "WANDB_NAME",
)
CHIEF_ENV = "TFCTL_CHIEF"


@dataclass(frozen=True)
class MlflowSettings:
    """An MLflow tracking server, spoken to over its REST API (no library needed here)."""

    uri: str
    experiment: str | None = None  # None: the cluster's name


@dataclass(frozen=True)
class WandbSettings:
    """A W&B project; the tasks' own `wandb` makes the run, with the id tfctl gives it."""

    project: str
    entity: str | None = None
    mode: str | None = None  # WANDB_MODES; None: W&B's default (online)


@dataclass(frozen=True)
class TrackingSettings:
    mlflow: MlflowSettings | None = None
    wandb: WandbSettings | None = None

    def variables(self) -> tuple[str, ...]:
        """The environment variables tfctl gives every task while these trackers are on."""
        return (CHIEF_ENV, *(MLFLOW_ENV if self.mlflow else ()), *(WANDB_ENV if self.wandb else ()))
