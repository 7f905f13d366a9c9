"""One Slurm allocation per run: ask for it, wait for it, read its state, end it.

Every Slurm command goes through an injected runner (argv in, `CompletedProcess` out), so the
decisions are tested without a cluster and the real commands against a real Slurm. Values go to
Slurm as argv words, never through a shell.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

from tfctl.backends.slurm.placement import node_count, settings_of, task_count
from tfctl.config.model import ClusterConfig
from tfctl.errors import BackendError


class SlurmError(BackendError):
    """Slurm refused, lost or ended the run's allocation."""


Runner = Callable[[list[str], "str | None"], "subprocess.CompletedProcess[str]"]
Progress = Callable[[str, str], None]
# What the batch step runs: nothing but holding the allocation until tfctl ends it.
HOLDER = "#!/bin/sh\nexec sleep 2147483647\n"
ENDED = (
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "PREEMPTED",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
)
POLL = 0.5


def run_slurm(argv: list[str], stdin: str | None) -> subprocess.CompletedProcess[str]:
    """The real runner; a missing command means this machine is not a Slurm login node."""
    try:
        return subprocess.run(argv, input=stdin or "", capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        raise SlurmError(
            f"`{argv[0]}` not found: `backend: slurm` needs Slurm's commands",
            hint="run tfctl on the cluster's login node (where `sbatch` and `srun` work), or load its module",
        ) from e
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"`{' '.join(argv[:2])}` did not answer within 60s: is slurmctld up?") from e


@dataclass(frozen=True)
class JobState:
    """What Slurm says of the allocation: `state` as squeue spells it, `reason` while pending."""

    state: str  # PENDING, RUNNING, ..., or "" once Slurm has forgotten the job
    reason: str
    nodes: tuple[str, ...]

    @property
    def ended(self) -> bool:
        return not self.state or self.state.split()[0] in ENDED


def sbatch_argv(config: ClusterConfig, name: str) -> list[str]:
    """sbatch for the allocation of all the cluster's tasks: the GPUs of all of them, and for
    every task the cores of the one that asks for the most."""
    settings = settings_of(config)
    argv = [
        *("sbatch", "--parsable", f"--job-name={name}", f"--nodes={node_count(config)}"),
        *(f"--ntasks={task_count(config)}", "--output=/dev/null"),
    ]
    for flag, value in (("partition", settings.partition), ("time", settings.time)):
        if value:
            argv.append(f"--{flag}={value}")
    for flag, value in (("account", settings.account), ("qos", settings.qos)):
        if value:
            argv.append(f"--{flag}={value}")
    if settings.signal_before:  # to every step (the tasks), not the holder
        argv.append(f"--signal=TERM@{settings.signal_before}")
    gpus = sum((job.gpus or 0) * (job.count or 0) for job in config.jobs.values())
    cpus = max((job.cpus or 0) for job in config.jobs.values())
    if gpus:
        argv.append(f"--gpus={gpus}")
    if cpus:
        argv.append(f"--cpus-per-task={cpus}")
    return [*argv, *settings.extra]


def submit(config: ClusterConfig, name: str, run: Runner = run_slurm) -> str:
    """Ask Slurm for the allocation; its job id. Slurm's own refusal is the message."""
    result = run(sbatch_argv(config, name), HOLDER)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().replace("sbatch: error: ", "")
        raise SlurmError(
            f"Slurm refused the allocation: {said}", hint="check the `slurm:` section (partition, time, account)"
        )
    return result.stdout.strip().split(";")[0]


def job_state(job_id: str, run: Runner = run_slurm) -> JobState:
    """The allocation's state, reason and nodes; state "" once Slurm no longer knows the job."""
    result = run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%r|%N"], None)
    line = result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else ""
    if not line:
        return _ended_state(job_id, run)
    state, reason, nodelist = (line.split("|") + ["", ""])[:3]
    return JobState(state, _said(reason), expand_nodes(nodelist, run))


def _ended_state(job_id: str, run: Runner) -> JobState:
    """squeue forgets a finished job at once; scontrol keeps it for a while (MinJobAge)."""
    result = run(["scontrol", "show", "job", "--oneliner", job_id], None)
    fields = dict(word.split("=", 1) for word in result.stdout.split() if "=" in word)
    return JobState(fields.get("JobState", ""), _said(fields.get("Reason", "")), ())


def _said(value: str) -> str:
    """A field as Slurm prints it, "" where Slurm prints that there is none."""
    return "" if value in ("None", "(null)") else value


def expand_nodes(nodelist: str, run: Runner = run_slurm) -> tuple[str, ...]:
    """`tfh[0-2]` -> (tfh0, tfh1, tfh2), as Slurm itself expands it."""
    if not _said(nodelist):
        return ()
    result = run(["scontrol", "show", "hostnames", nodelist], None)
    return tuple(result.stdout.split())


def wait_running(job_id: str, progress: Progress, run: Runner = run_slurm, poll: float = POLL) -> tuple[str, ...]:
    """Wait until the allocation runs (saying why while it waits); its nodes."""
    said = ""
    while True:
        state = job_state(job_id, run)
        if state.state == "RUNNING" and state.nodes:
            return state.nodes
        if state.ended:
            raise SlurmError(f"Slurm job {job_id} ended before it started: {describe(state)}")
        news = f"job {job_id} {state.state.lower()}" + (
            f": waiting for {reason_text(state.reason)}" if state.reason else ""
        )
        if news != said:
            progress("slurm", news)
            said = news
        time.sleep(poll)


def time_left(job_id: str, run: Runner = run_slurm) -> float | None:
    """Seconds until the allocation's time limit, as squeue says (`%L`); None: no limit, or Slurm
    does not know the job."""
    result = run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%L"], None)
    words = result.stdout.split() if result.returncode == 0 else []
    if not words or not _TIME_LEFT_RE.fullmatch(words[0]):
        return None
    days, _, clock = words[0].rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


_TIME_LEFT_RE = re.compile(r"(\d+-)?\d+(:\d+){0,2}")


def wait_ended(job_id: str, patience: float, run: Runner = run_slurm, poll: float = POLL) -> JobState:
    """The allocation's state once it ended, or as it is after `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        state = job_state(job_id, run)
        if state.ended or time.monotonic() > deadline:
            return state
        time.sleep(poll)


def reason_text(reason: str) -> str:
    """Slurm's pending reasons, as a sentence."""
    known = {
        "Resources": "resources (nodes are busy)",
        "Priority": "resources: Priority (other jobs come first)",
        "ReqNodeNotAvail": "nodes that are not available",
        "PartitionTimeLimit": "a time limit the partition allows (lower `slurm.time`)",
    }
    return known.get(reason, reason)


def describe(state: JobState) -> str:
    """Why a job is over, in Slurm's words: `TIMEOUT`, `CANCELLED by 0`, `NODE_FAIL`."""
    if not state.state:
        return "Slurm no longer knows the job"
    return state.state + (f" ({state.reason})" if state.reason else "")


def cancel(job_id: str, run: Runner = run_slurm, patience: float = 30.0) -> JobState:
    """End the allocation and wait until Slurm says it ended; the final state."""
    run(["scancel", job_id], None)
    return wait_ended(job_id, patience, run)


def current_job() -> str | None:
    """The allocation tfctl runs inside (salloc, sbatch), if any: used as is, never ended."""
    return os.environ.get("SLURM_JOB_ID") or None
