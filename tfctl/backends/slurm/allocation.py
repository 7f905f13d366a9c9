"""One Slurm allocation per run: ask for it, wait for it, read its state, end it.

Every Slurm command goes through an injected runner (argv in, `CompletedProcess` out), so the
decisions are tested without a cluster and the real commands against a real Slurm. Values go to
Slurm as argv words, never through a shell.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable

from tfctl.backends.slurm.placement import Component, components, settings_of
from tfctl.config.model import ClusterConfig
from tfctl.engine.clock import REAL_CLOCK, Clock
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
    """What Slurm says of the allocation: `state` as squeue spells it, `reason` while pending, and
    the nodes of each of its components (one, unless it is a heterogeneous job)."""

    state: str  # PENDING, RUNNING, ..., or "" once Slurm has forgotten the job
    reason: str
    components: tuple[tuple[str, ...], ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(node for nodes in self.components for node in nodes))

    @property
    def ended(self) -> bool:
        return not self.state or self.state.split()[0] in ENDED


def sbatch_argv(config: ClusterConfig, name: str, options: tuple[str, ...] = ("--output=/dev/null",)) -> list[str]:
    """sbatch for the allocation of all the cluster's tasks; a heterogeneous job (components
    separated by `:`) when jobs ask for different nodes. `options`: the whole job's (its output)."""
    argv = ["sbatch", "--parsable", f"--job-name={name}", *options]
    for index, component in enumerate(components(config)):
        argv += [":"] if index else []
        argv += _component_argv(config, component)
    return argv


def _component_argv(config: ClusterConfig, component: Component) -> list[str]:
    """One component's options: its nodes and tasks, the GPUs of all its tasks, and for every
    task the cores of the one that asks for the most; then the `slurm:` section's limits."""
    settings = settings_of(config)
    argv = [f"--nodes={component.nodes}", f"--ntasks={component.tasks}"]
    asks = (
        ("partition", component.partition),
        ("constraint", component.constraint),
        ("mem", component.mem),
        ("time", settings.time),
        ("account", settings.account),
        ("qos", settings.qos),
    )
    argv += [f"--{flag}={value}" for flag, value in asks if value]
    if settings.signal_before:  # to every step (the tasks), not the holder
        argv.append(f"--signal=TERM@{settings.signal_before}")
    if component.gpus:
        argv.append(f"--gpus={component.gpus}")
    if component.cpus:
        argv.append(f"--cpus-per-task={component.cpus}")
    return [*argv, *component.extra]


def submit(config: ClusterConfig, name: str, run: Runner = run_slurm) -> str:
    """Ask Slurm for the allocation, held by a script that only waits; its job id."""
    return submit_script(sbatch_argv(config, name), HOLDER, run)


def submit_script(argv: list[str], script: str, run: Runner = run_slurm) -> str:
    """Submit `script` as the batch job `argv` asks for; its job id. Slurm's own refusal is the message."""
    result = run(argv, script)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().replace("sbatch: error: ", "")
        raise SlurmError(
            f"Slurm refused the allocation: {said}", hint="check the `slurm:` section (partition, time, account)"
        )
    return result.stdout.strip().split(";")[0]


def job_state(job_id: str, run: Runner = run_slurm) -> JobState:
    """The allocation's state, reason and nodes; state "" once Slurm no longer knows the job. Of a
    heterogeneous job (a line per component, `ID+N`): running once every component runs, and
    otherwise as its first component that does not."""
    result = run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%i|%T|%r|%N"], None)
    lines = result.stdout.strip().splitlines() if result.returncode == 0 else []
    parts = [(line.split("|") + ["", "", ""])[:4] for line in lines if line.strip()]
    parts.sort(key=lambda part: int(part[0].partition("+")[2] or 0))
    if not parts:
        return _ended_state(job_id, run)
    _, state, reason, _ = next((part for part in parts if part[1] != "RUNNING"), parts[0])
    return JobState(state, _said(reason), tuple(expand_nodes(part[3], run) for part in parts))


def batch_host(job_id: str, run: Runner = run_slurm) -> str | None:
    """The node the job's batch script runs on (None: Slurm no longer says)."""
    return _said(job_fields(job_id, run).get("BatchHost", "")) or None


def recorded_state(job_id: str, run: Runner = run_slurm) -> tuple[str, str, bool]:
    """The job's state and reason as slurmctld says them now; of a job being ended, `COMPLETING`
    and, of a time limit, the reason `TimeLimit` ("" where Slurm says none). Last, whether it is
    being preempted: `PreemptTime` is set the moment preemption begins, while the state still
    reads `COMPLETING` (seen on slurm-wlm 22.05 with `PreemptMode=CANCEL`)."""
    fields = job_fields(job_id, run)
    preempted = bool(_said(fields.get("PreemptTime", "")))
    return _said(fields.get("JobState", "")), _said(fields.get("Reason", "")), preempted


def _ended_state(job_id: str, run: Runner) -> JobState:
    """squeue forgets a finished job at once; scontrol keeps it for a while (MinJobAge), and
    accounting (where it is kept) for good."""
    fields = job_fields(job_id, run)
    state = fields.get("JobState", "") or _accounted_state(job_id, run)
    return JobState(state, _said(fields.get("Reason", "")))


def _accounted_state(job_id: str, run: Runner) -> str:
    """The job's final state in Slurm's accounting (`sacct`); "" where it keeps none."""
    result = run(["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}", "--format=State"], None)
    words = result.stdout.split() if result.returncode == 0 else []
    return words[0] if words else ""


def job_fields(job_id: str, run: Runner = run_slurm) -> dict[str, str]:
    """`scontrol show job`'s fields of the job (of its first component), as Slurm spells them."""
    result = run(["scontrol", "show", "job", "--oneliner", job_id], None)
    first = (result.stdout.strip().splitlines() or [""])[0]
    return dict(word.split("=", 1) for word in first.split() if "=" in word)


def _said(value: str) -> str:
    """A field as Slurm prints it, "" where Slurm prints that there is none."""
    return "" if value in ("None", "(null)") else value


def expand_nodes(nodelist: str, run: Runner = run_slurm) -> tuple[str, ...]:
    """`tfh[0-2]` -> (tfh0, tfh1, tfh2), as Slurm itself expands it."""
    if not _said(nodelist):
        return ()
    result = run(["scontrol", "show", "hostnames", nodelist], None)
    return tuple(result.stdout.split())


def wait_running(job_id: str, progress: Progress, run: Runner = run_slurm, clock: Clock = REAL_CLOCK) -> JobState:
    """Wait until the allocation runs (saying why while it waits); its state, with its nodes."""
    said = ""
    while True:
        state = job_state(job_id, run)
        if state.state == "RUNNING" and all(state.components):
            return state
        if state.ended:
            raise SlurmError(f"Slurm job {job_id} ended before it started: {describe(state)}")
        news = f"job {job_id} {state.state.lower()}" + (
            f": waiting for {reason_text(state.reason)}" if state.reason else ""
        )
        if news != said:
            progress("slurm", news)
            said = news
        clock.sleep(POLL)


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


def wait_ended(job_id: str, patience: float, run: Runner = run_slurm, clock: Clock = REAL_CLOCK) -> JobState:
    """The allocation's state once it ended, or as it is after `patience` seconds."""
    deadline = clock.monotonic() + patience
    while True:
        state = job_state(job_id, run)
        if state.ended or clock.monotonic() > deadline:
            return state
        clock.sleep(POLL)


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


def cancel(job_id: str, run: Runner = run_slurm, clock: Clock = REAL_CLOCK, patience: float = 30.0) -> JobState:
    """End the allocation and wait until Slurm says it ended; the final state."""
    run(["scancel", job_id], None)
    return wait_ended(job_id, patience, run, clock)


def current_job() -> str | None:
    """The allocation tfctl runs inside (salloc, sbatch), if any: used as is, never ended."""
    return os.environ.get("SLURM_JOB_ID") or None
