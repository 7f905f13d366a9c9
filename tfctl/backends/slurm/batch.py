"""The run's controller inside its allocation (`slurm: {controller: allocation}`): `up` on the
login node submits one batch job whose script is `tfctl up` itself, on the allocation's first
node. That `up` finds itself inside tfctl's own allocation (`CONTROLLER_ENV` names it), starts
the tasks as steps from there and follows the run to its end; the script's end releases the
allocation. The login node is needed only to submit: its `up` just relays the batch script's
output (until the tasks run, with `-d`), and every later verb reaches the nodes through the
allocation (`srun --overlap --jobid`), from any login node that shares the home.

The batch script's output is kept under `~/.tfctl/slurm/` (0600), named by the job.

Resubmission (`resubmit: N`): the controller dies with its allocation, so it cannot ask for the
next one then. It asks up front: once its allocation runs, it submits the successor batch job
(`submit_successor`), held by Slurm until this one ends in a failed state
(`--dependency=afternotok`: a time limit, a preemption, a cancel, a crash) and dropped by Slurm
if it ends well (`--kill-on-invalid-dep`). Nothing has to happen at the moment of death (no
signal handler racing Slurm's SIGKILL, no node left to run on): the successor is already queued
when the allocation times out or is preempted, and a controller killed outright still leaves it.
Its script takes up the same run (`tfctl _take_up --run ID`), and what it does is decided again
there, on the run record and Slurm's word on the allocation before (`engine.resubmission`): a
cancel or a run already ended by a `down` end it at once. A controller that ends the run cancels
its successor first. Slurm's own requeue was not chosen: it keeps one job id for every
allocation (so the allocations' accounting could not be told apart), it does not follow a time
limit, and it needs the dying controller to ask for it or a site's `PreemptMode=REQUEUE`.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tfctl.backends.slurm.allocation import (
    POLL,
    JobState,
    Runner,
    cancel,
    describe,
    job_fields,
    job_state,
    reason_text,
    run_slurm,
    sbatch_argv,
    submit_script,
)
from tfctl.config.home import tfctl_home
from tfctl.config.model import ClusterConfig
from tfctl.engine.clock import REAL_CLOCK, Clock

CONTROLLER_ENV = "TFCTL_CONTROLLER_JOB"  # set by tfctl's batch script: the allocation is the run's own
ALLOCATION_ENV = "TFCTL_ALLOCATION"  # set by a successor's batch script: which allocation of the run it is
COMMENT = "tfctl run controller"  # how tfctl's batch jobs are told from others (`squeue -o %k`)
RUNNING = re.compile(r"\ball \d+ tasks running$")
RUN_ID = re.compile(r"^run (\S+): \d+ tasks? on ")
SUCCESSOR = re.compile(r"\bjob (\d+) takes the run up if job (\d+) ends under it$")
Say = Callable[[str], None]


def batch_script(config: ClusterConfig, resume: str | None = None) -> str:
    """`tfctl up` of the cluster file, attached, by this very interpreter (the nodes share its
    files), continuing run `resume` if given; every value quoted here, none read by a shell from
    the cluster file."""
    python, path = shlex.quote(sys.executable), shlex.quote(str(config.path.resolve()))
    resuming = "" if resume is None else f" --resume {shlex.quote(resume)}"
    return f'#!/bin/sh\nexport {CONTROLLER_ENV}="$SLURM_JOB_ID"\nexec {python} -m tfctl -f {path} up{resuming}\n'


def successor_script(run_id: str, allocation: int) -> str:
    """The successor's script: the same run taken up, as its `allocation`-th allocation."""
    python = shlex.quote(sys.executable)
    env = f'export {CONTROLLER_ENV}="$SLURM_JOB_ID" {ALLOCATION_ENV}={allocation}'
    return f"#!/bin/sh\n{env}\nexec {python} -m tfctl _take_up --run {shlex.quote(run_id)}\n"


def allocation_number() -> int:
    """Which allocation of its run this batch job is: 1, unless a successor's script says."""
    said = os.environ.get(ALLOCATION_ENV, "")
    return int(said) if said.isdigit() else 1


@dataclass(frozen=True)
class BatchJob:
    job_id: str
    out: Path  # the batch script's stdout: the tasks' output, as an attached `up` prints it
    err: Path  # its stderr: `up`'s progress and end


def submit_controller(config: ClusterConfig, resume: str | None = None, run: Runner = run_slurm) -> BatchJob:
    """Submit the batch job that runs the controller (of a run continuing run `resume`, if given);
    its output files, made 0600 beforehand."""
    return _submit(config, batch_script(config, resume), (), run)


def submit_successor(config: ClusterConfig, run_id: str, after: str, run: Runner = run_slurm) -> BatchJob:
    """Queue the batch job that takes the run up once job `after` (this allocation) ends in a
    failed state; Slurm drops it if `after` ends well."""
    held = (f"--dependency=afternotok:{after}", "--kill-on-invalid-dep=yes")
    return _submit(config, successor_script(run_id, allocation_number() + 1), held, run)


def _submit(config: ClusterConfig, script: str, options: tuple[str, ...], run: Runner) -> BatchJob:
    logs = tfctl_home() / "slurm"
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    stem = f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out, err = logs / f"{stem}.out", logs / f"{stem}.err"
    for path in (out, err):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    output = (f"--output={out}", f"--error={err}", f"--comment={COMMENT}", *options)
    job_id = submit_script(sbatch_argv(config, f"tfctl-{config.name}", output), script, run)
    return BatchJob(job_id, out, err)


class _Tail:
    """New whole lines of a file, as it grows."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def lines(self) -> list[str]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *whole, self.rest = (self.rest + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in whole]


def follow(
    job: BatchJob,
    detach: bool,
    out: Say,
    err: Say,
    run: Runner = run_slurm,
    clock: Clock = REAL_CLOCK,
    abandoned: Say = lambda _run_id: None,
) -> int:
    """Relay the batch script's output until the job ends (its `up`'s exit code), or with
    `detach` until its tasks all run (0; the run id on stdout); while Slurm queues it, say why.
    A job whose controller handed the run over to its successor is followed by the successor's
    (a resubmitted run), until the run's last. Ctrl-C here stops the run: the batch script's
    `up` gets SIGINT, stops every task, and its end releases the allocation (a job still queued
    is cancelled: a successor queued to take a run up leaves nobody to record the run's end, so
    `abandoned(run_id)` does)."""
    tails = (_Tail(job.err), _Tail(job.out))
    run_id = said = successor = ""
    try:
        while True:
            state = job_state(job.job_id, run)
            if state.state == "PENDING":
                news = f"job {job.job_id} pending" + (
                    f": waiting for {reason_text(state.reason)}" if state.reason else ""
                )
                if news != said:
                    err(news)
                    said = news
            for line in tails[0].lines():
                err(line)
                run_id = run_id or _run_id(line)
                successor = _successor(job.job_id, line) or successor
                if detach and RUNNING.search(line):
                    err(
                        f"the run's controller runs in slurm job {job.job_id}: this shell may end; "
                        "`tfctl status`, `logs`, `down` reach it from any login node"
                    )
                    out(run_id)
                    return 0
            for line in tails[1].lines() if not detach else []:
                out(line)
            if state.ended:
                for tail, say in zip(tails, (err, out)):
                    for line in tail.lines():
                        say(line)
                taken = _taken_up_by(successor, run)
                if taken is None:
                    return _exit_code(job.job_id, run)
                err(f"slurm job {job.job_id} ended; the run goes on in slurm job {taken.job_id}")
                job, tails, said, successor = taken, (_Tail(taken.err), _Tail(taken.out)), "", ""
                continue
            clock.sleep(POLL)
    except KeyboardInterrupt:
        if job_state(job.job_id, run).state == "PENDING":
            ended = cancel(job.job_id, run, clock)
            if run_id:  # the run's controller ran before: this is its successor
                abandoned(run_id)
        else:
            run(["scancel", "--batch", "--signal=INT", job.job_id], None)
            err(f"interrupted: the run's controller (slurm job {job.job_id}) stops every task and ends the job")
            ended = _wait_or_cancel(job.job_id, run, clock)
        for line in tails[0].lines():
            err(line)
        err(f"slurm job {job.job_id}: {describe(ended)}")
        return 130


def _successor(job_id: str, line: str) -> str:
    """The successor a controller queued, from the line it says it with."""
    found = SUCCESSOR.search(line)
    return found.group(1) if found and found.group(2) == job_id else ""


def _taken_up_by(successor: str, run: Runner) -> BatchJob | None:
    """The successor that takes the run up now that the job before it ended: its output files,
    as Slurm has them. None when none does: there was none, or the run ended and its controller
    cancelled it (or Slurm dropped it, the job before having ended well)."""
    if not successor:
        return None
    fields = job_fields(successor, run)
    if fields.get("JobState") not in ("PENDING", "RUNNING") or fields.get("Reason") == "DependencyNeverSatisfied":
        return None
    return BatchJob(successor, Path(fields.get("StdOut", "")), Path(fields.get("StdErr", "")))


def _run_id(line: str) -> str:
    found = RUN_ID.match(line)
    return found.group(1) if found else ""


def _wait_or_cancel(job_id: str, run: Runner, clock: Clock, patience: float = 60.0) -> JobState:
    deadline = clock.monotonic() + patience
    while clock.monotonic() < deadline:
        state = job_state(job_id, run)
        if state.ended:
            return state
        clock.sleep(POLL)
    return cancel(job_id, run, clock)


def _exit_code(job_id: str, run: Runner) -> int:
    """The batch script's exit code, as Slurm kept it (`ExitCode=N:signal`); 1 when unknown."""
    code = job_fields(job_id, run).get("ExitCode", "").partition(":")[0]
    return int(code) if code.isdigit() else 1
