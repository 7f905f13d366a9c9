"""A run on Slurm from start to end: the allocation it runs in, its tasks as job steps, and the
allocation's end as part of the run's end.

The run record keeps `allocation` ({"job_id", "owned"}): an allocation tfctl asked for is ended
with the run; one tfctl found itself inside (`SLURM_JOB_ID`) is left to its owner.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any, Callable, Sequence

from tfctl.backends.slurm.allocation import (
    JobState,
    Progress,
    Runner,
    cancel,
    current_job,
    describe,
    job_state,
    run_slurm,
    submit,
    wait_running,
)
from tfctl.backends.slurm.placement import place, step_options, task_count
from tfctl.backends.slurm.transport import step_argv
from tfctl.cluster.control import Outcome
from tfctl.config.model import ClusterConfig
from tfctl.supervisor.protocol import RunState

JUDGE_EVERY = 5.0  # seconds between two looks at the allocation while the run goes on


def allocate(
    config: ClusterConfig, run_id: str, progress: Progress, run: Runner = run_slurm
) -> tuple[ClusterConfig, dict[str, Any]]:
    """The cluster placed on an allocation's nodes, and the allocation as the run record keeps it."""
    tasks = task_count(config)
    job_id = current_job()
    owned = job_id is None
    if job_id is None:
        job_id = submit(config, f"tfctl-{run_id}", run)
        progress("slurm", f"asked for {tasks} tasks: job {job_id}")
    else:
        progress("slurm", f"inside allocation {job_id} (SLURM_JOB_ID): using its nodes")
    try:
        nodes = wait_running(job_id, progress, run)
    except BaseException:
        if owned:
            cancel(job_id, run)
        raise
    progress("slurm", f"job {job_id} running on {', '.join(nodes)}")
    return place(config, nodes, job_id), {"job_id": job_id, "owned": owned, "steps": step_options(config)}


def release(allocation: dict[str, Any] | None, run: Runner = run_slurm) -> JobState | None:
    """End an allocation tfctl asked for; its state once Slurm says it ended (None: nothing to end)."""
    if not allocation or not allocation.get("owned"):
        return None
    return cancel(allocation["job_id"], run)


def launch_monitors(
    job_id: str, node: str, python: str, artifact: str, root: str, run_id: str, tasks: Sequence[tuple[str, list[str]]]
) -> None:
    """Start each task's monitor as a job step of its own on `node`.

    The step lasts as long as its monitor, so Slurm accounts for the task and ends it with the
    job. Its `srun` runs here, detached: a step ends when its srun does, so srun must outlive the
    `up` that started it (and is a child of nobody a terminal's Ctrl-C reaches).
    """
    for task, asks in tasks:
        argv = step_argv(job_id, node, name=f"{run_id}:{task}", extra=tuple(asks))
        subprocess.Popen(
            [*argv, python, "-I", "-S", artifact, "_step", root, run_id, task],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )


def allocation_judge(allocation: dict[str, Any], run: Runner = run_slurm) -> Callable[[Sequence[Any]], Outcome | None]:
    """Fails the run once Slurm ends the allocation under it (time limit, preemption, scancel)."""
    looked = 0.0

    def judge(_statuses: Sequence[Any]) -> Outcome | None:
        nonlocal looked
        if time.monotonic() - looked < JUDGE_EVERY:
            return None
        looked = time.monotonic()
        state = job_state(allocation["job_id"], run)
        if not state.ended:
            return None
        return Outcome(RunState.FAILED, f"Slurm ended job {allocation['job_id']}: {describe(state)}")

    return judge
