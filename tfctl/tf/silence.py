"""The task that never trains and says nothing: with TensorFlow's defaults a between-graph
worker whose variables nobody initialises waits in silence (`tf.compat.v1` logs at WARN, and
MonitoredTrainingSession or Supervisor look again only every 30 s), so no log line tells. Its
peers tell instead: they step, or keep printing, while it prints nothing.

Pure: what each task printed in, the silent ones with what TF most likely waits for out. The
controller feeds it from its hosts' answers (`TaskStatus`) at the run's end, in `status`, in
the report, and live once a silence lasts the run's `hang_timeout`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from tfctl.supervisor.protocol import TaskState

if TYPE_CHECKING:
    from tfctl.engine.observed import TaskStatus
    from tfctl.tf.progress import TaskProgress

# Not silent in this sense: not started, failed (its own diagnosis says why), or done by itself
# (exit 0: it finished its work; `progress.never_stepped` still names one that logged no step).
QUIET_BY_RIGHT = (TaskState.PENDING, TaskState.FAILED, TaskState.SUCCEEDED, TaskState.UNREACHABLE)
AT_END = 10.0  # seconds of silence, while a peer went on, that name a task once the run ended
# TF's runtime said the last word (its C++ log, or its session's start): the program's own code
# runs no more, as when a session waits for its variables.
SESSION_UP = re.compile(
    r"^[IWE]\d{4} [\d:. ]+\d+ [\w.]+\.cc:\d+\]|Scanning workers for devices|Created TensorFlow session|"
    r"Started server with target|Running local_init_op|Done running local_init_op|Graph was finalized|"
    r"CoordinationService"
)
SESSION_WAIT = (
    "its TF session is up (its last line is TF's), so it most likely waits in MonitoredTrainingSession "
    "(or Supervisor) for the chief to initialise the variables it reads: variables placed on this "
    "worker's own task (a tf.device of /job:worker/task:N) are initialised by nobody. TF looks again "
    "every 30 s and, at its default log level, says nothing: its `Waiting for model to be ready` is an "
    "INFO line"
)
SESSION_FIX = (
    "to see what it waits for, call tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO) in "
    "the program; to make it train, place the variables on a ps "
    "(tf.compat.v1.train.replica_device_setter(cluster=...)) so the chief's init covers them"
)
OTHER_WAIT = "it waits on something its output does not say (a peer, its input pipeline, a lock)"
OTHER_FIX = (
    "see where it waits: `py-spy dump --pid PID` on its host (`tfctl status` shows the PID), or raise "
    "its log level: tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)"
)


@dataclass(frozen=True)
class Output:
    """What one task printed, as its host and the progress reader see it."""

    task: str
    job: str
    state: TaskState
    step: int | None = None  # the last step it logged; None: no line of it reads as a step
    lines: int | None = None  # lines it printed so far; None: not counted
    last_at: float | None = None  # when it last printed (its host's clock); None: never
    last_line: str = ""
    ended_at: float | None = None


@dataclass(frozen=True)
class Silence:
    task: str
    quiet: float  # seconds it printed nothing while the peer went on
    after: str  # its last line
    peer: str
    peer_did: str  # "printed 5000 lines", "reached step 1200"
    cause: str  # what TF most likely waits for
    fix: str  # how to see it, and how to make it train

    def text(self, ended: bool = True, named: bool = True) -> str:
        """`worker:1 printed nothing for 21 s after `...` while worker:0 printed 5000 lines: it never
        trained`; without the task's name where a note already starts with it."""
        after = f" after `{self.after}`" if self.after else ""
        verdict = "it never trained" if ended else "it is not training"
        said = f"printed nothing for {self.quiet:.0f} s{after} while {self.peer} {self.peer_did}: {verdict}"
        return f"{self.task} {said}" if named else said


def silences(tasks: Sequence[Output], now: float, least: float = AT_END) -> dict[str, Silence]:
    """The tasks that made no visible progress for `least` seconds while a task of their job
    did: by steps where the job's output has them, else by output lines (a peer that went on
    printing that long after this one stopped). Only peers of the same job count: a TF2
    ParameterServerStrategy's workers print nothing while its chief steps, as they should."""
    found = {}
    for t in tasks:
        if t.step is not None or t.last_at is None or t.state in QUIET_BY_RIGHT:
            continue
        last = t.last_at
        quiet = (t.ended_at if t.ended_at is not None and t.state.is_final else now) - last
        peers = [p for p in tasks if p.job == t.job and p.task != t.task and p.last_at is not None]
        stepping = [p for p in peers if p.step is not None]
        if stepping:
            peer = max(stepping, key=lambda p: p.step or 0)
            did = f"reached step {peer.step}"
        else:  # went on printing that long after it stopped, and (where counted) far more
            going = [p for p in peers if (p.last_at or 0.0) - last >= least and (p.lines or 0) >= 2 * (t.lines or 0)]
            if not going:
                continue
            peer = max(going, key=lambda p: (p.lines or 0, p.last_at or 0.0))
            quiet = min(quiet, (peer.last_at or now) - last)
            did = f"printed {peer.lines} lines" if peer.lines is not None else "went on printing"
        if quiet < least:
            continue
        cause, fix = likely_wait(t.last_line)
        found[t.task] = Silence(t.task, quiet, t.last_line, peer.task, did, cause, fix)
    return found


def likely_wait(last_line: str) -> tuple[str, str]:
    """What TF most likely waits for, from the program's shape its last line shows, and how to see it."""
    if SESSION_UP.search(last_line):
        return SESSION_WAIT, SESSION_FIX
    return OTHER_WAIT, OTHER_FIX


def outputs(
    statuses: Sequence[TaskStatus], progress: Mapping[str, TaskProgress], last_lines: Mapping[str, str]
) -> list[Output]:
    """Each task's output as `silences` reads it, from the hosts' answers and the progress read from them."""
    return [
        Output(
            s.task,
            s.job,
            s.state,
            progress[s.task].step if s.task in progress else None,
            s.output_lines,
            s.output_at,
            last_lines.get(s.task) or s.last_line,
            s.ended_at,
        )
        for s in statuses
    ]
