"""Training progress read from task output: the last step, steps/s, and who lags or is stuck.

Hosts only find the lines (`supervisor/marks.py`, with the pattern built here) and when each was
written; what the lines mean is decided here. Recognised out of the box:

    INFO:tensorflow:global_step/sec: 31.4       TF's StepCounterHook (a rate)
    INFO:tensorflow:loss = 0.3, step = 120      TF's LoggingTensorHook
    Step #120   global step 120   step: 120     common hand-written shapes
    Epoch 3/10  then  120/938 [====>....]       Keras (step = 2 * 938 + 120)
    Finished epoch 3   epoch 3   epoch: 3       epochs of a custom loop, as progress of their own

A cluster file's `progress.regex` (with a `(?P<step>...)` group, or `(?P<rate>...)`) replaces
them. TensorFlow's own C++ log lines (`I0000 00:00:...`) are never progress.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from tfctl.supervisor.protocol import Mark, ProgressRule, TaskState
from tfctl.tf.results import ResultReader

if TYPE_CHECKING:
    from tfctl.engine.observed import TaskStatus
    from tfctl.runs.record import ProgressSpec

DEFAULT_WINDOW = 60.0
MIN_SPAN = 2.0  # seconds between two samples for a rate: line times are exact to a second
STRAGGLER_RATIO = 0.5

BUILT_IN = {
    "rate": r".*?\bglobal_step/sec: ?(?P<rate>[0-9.]+(?:[eE][-+]?\d+)?)",
    "tf_step": r".*?\bstep = (?P<step>\d+)",
    "hash_step": r".*?\bStep #(?P<step>\d+)",
    "global_step": r".*?\b(?i:global[ _]step)\b[ :=#]*(?P<step>\d+)",
    "step": r".*?\b(?i:step)\b[ :=#]*(?P<step>\d+)",
    "keras_epoch": r"Epoch (?P<epoch>\d+)/\d+\s*$",
    "keras_bar": r"\s*(?P<step>\d+)/(?P<of>\d+) +(?:\[|━)",  # Keras 2 `[==>..]`, Keras 3 a bar of U+2501
    "epoch": r".*?\b(?i:epoch)\b[ :=#]*(?P<epoch>\d+)",
}
NOT_PROGRESS = r"(?![IWEF]\d{4} \d\d:\d\d:)"  # a glog line from TF's C++ runtime
SERVER_STARTED = r"Started server with target: "  # TF's line once a task's server listens


@dataclass(frozen=True)
class Progress:
    """One task's progress: None where its output does not tell."""

    step: int | None = None
    steps_per_sec: float | None = None
    quiet_for: float | None = None  # seconds since its newest step line (or its start, if none)
    epoch: int | None = None  # the newest epoch its output names


class ProgressReader:
    """The pattern hosts search for, and the meaning of the lines they find."""

    def __init__(self, regex: str | None = None, window: float = DEFAULT_WINDOW) -> None:
        self.window = window
        if regex is None:
            self._kinds = [(name, re.compile(NOT_PROGRESS + p)) for name, p in BUILT_IN.items()]
            alternatives = "|".join(f"(?P<{name}>{p})" for name, p in self._kinds_patterns())
            self.pattern = f"^{NOT_PROGRESS}(?:{alternatives})"
        else:
            self._kinds = [("user", re.compile(regex))]
            self.pattern = regex

    def _kinds_patterns(self) -> list[tuple[str, str]]:
        # Inner groups are renamed away on the host: only the kind (the alternative) matters there.
        return [(name, re.sub(r"\(\?P<\w+>", "(", p)) for name, p in BUILT_IN.items()]

    def rule(self) -> ProgressRule:
        return ProgressRule(self.pattern, self.window)

    def read(self, marks: Sequence[Mark], now: float, uptime: float | None, running: bool) -> Progress:
        """`now` is the host's clock, as the marks' times are."""
        samples, rates, epoch = self.samples(marks)
        last_at = samples[-1][0] if samples else (rates[-1][0] if rates else None)
        quiet = now - last_at if last_at is not None else uptime
        if quiet is not None and uptime is not None:
            quiet = min(quiet, uptime)  # restarted since its last step line: quiet only since then
        newest = samples[-1][1] if samples else None
        if not running:
            return Progress(newest, None, None, epoch)
        return Progress(newest, self._rate(samples, rates, now), quiet, epoch)

    def samples(self, marks: Sequence[Mark]) -> tuple[list[tuple[float, int]], list[tuple[float, float]], int | None]:
        """(time, step) and (time, steps/s) of the marks, oldest first, and the newest epoch named."""
        samples: list[tuple[float, int]] = []
        rates: list[tuple[float, float]] = []
        epoch: int | None = None
        for mark, step, rate, named in self.each(marks):
            epoch = named
            if rate is not None:
                rates.append((mark.time, rate))
            if step is not None:
                samples.append((mark.time, step))
        return samples, rates, epoch

    def each(self, marks: Sequence[Mark]) -> Iterator[tuple[Mark, int | None, float | None, int | None]]:
        """Every mark with what it says: its step, its steps/s, and the epoch named so far (a
        Keras bar's step counts the epochs before it)."""
        epoch: int | None = None
        for mark in marks:
            step: int | None = None
            rate: float | None = None
            for kind, regex in self._kinds:
                found = regex.match(mark.text) if kind != "user" else regex.search(mark.text)
                if found is None:
                    continue
                groups = found.groupdict()
                if groups.get("epoch"):
                    epoch = int(groups["epoch"])
                if groups.get("rate"):
                    rate = float(groups["rate"])
                if groups.get("step"):
                    step = int(groups["step"])
                    if groups.get("of") and epoch is not None:
                        step += (epoch - 1) * int(groups["of"])
                break
            yield mark, step, rate, epoch

    def history(self, marks: Sequence[Mark], min_span: float = MIN_SPAN) -> list[tuple[float, float]]:
        """Steps/s over time, oldest first: the program's own rate lines where it logs them, else
        each pair of step lines at least `min_span` seconds apart (a counter going back, as after
        a restart, starts afresh). Line times are exact to a second, so a short span swings: 2
        steps/s over 2 s reads anywhere from 1.3 to 4."""
        samples, rates, _ = self.samples(marks)
        if rates:
            return rates
        out: list[tuple[float, float]] = []
        anchor: tuple[float, int] | None = None
        for t, step in samples:
            if anchor is None or step < anchor[1]:
                anchor = (t, step)
            elif t - anchor[0] >= min_span:
                out.append((t, (step - anchor[1]) / (t - anchor[0])))
                anchor = (t, step)
        return out

    def _rate(self, samples: list[tuple[float, int]], rates: list[tuple[float, float]], now: float) -> float | None:
        horizon = now - self.window
        if rates and rates[-1][0] >= horizon and (not samples or rates[-1][0] >= samples[-1][0]):
            # The program's own rate, unless step lines came after it (newer evidence wins); a
            # rate of 0 before any step (tf.train.Supervisor logs one at its start) is no rate.
            if rates[-1][1] > 0 or any(t <= rates[-1][0] for t, _ in samples):
                return rates[-1][1]
            if not samples:
                return None
        if samples and samples[-1][0] < horizon:
            return 0.0  # nothing in the whole window: it is not moving
        # Only the run of samples since the counter last went back (a restart, a new Keras epoch
        # with no epoch line in view); the newest sample before the window anchors the rate.
        start = 0
        for i in range(1, len(samples)):
            if samples[i][1] < samples[i - 1][1]:
                start = i
        recent = samples[start:]
        anchor = max((i for i, (t, _) in enumerate(recent) if t <= horizon), default=0)
        if len(recent) - anchor < 2:
            return None
        first, last = recent[anchor], recent[-1]
        # A task that stopped stepping a while ago (more than twice its usual gap) has been slow
        # since: the window's rate counts that quiet time too.
        gap = (last[0] - first[0]) / (len(recent) - anchor - 1)
        end = last[0] if now - last[0] <= max(2 * gap, MIN_SPAN) else now
        if end - first[0] < MIN_SPAN:
            return None
        return (last[1] - first[1]) / (end - first[0])


def flags(
    tasks: Sequence[tuple[str, str, TaskState]], progress: dict[str, Progress], stall_timeout: float
) -> dict[str, list[str]]:
    """Per task (name, job, state): `restarting`; `stalled` when a task of a job that logs steps
    made none for `stall_timeout`; `straggler` under half the median rate of its job's tasks that
    are not stalled (a stalled task's falling rate would pull the median down and hide a slow one)."""
    out: dict[str, list[str]] = {name: [] for name, *_ in tasks}
    stepping_jobs = {job for name, job, _ in tasks if progress.get(name, Progress()).step is not None}
    stalled = {
        name
        for name, job, state in tasks
        if state is TaskState.RUNNING
        and job in stepping_jobs
        and (quiet := progress.get(name, Progress()).quiet_for) is not None
        and quiet > stall_timeout
    }
    rates_by_job: dict[str, list[float]] = {}
    for name, job, state in tasks:
        rate = progress.get(name, Progress()).steps_per_sec
        if state is TaskState.RUNNING and rate is not None and name not in stalled:
            rates_by_job.setdefault(job, []).append(rate)
    for name, job, state in tasks:
        p = progress.get(name, Progress())
        if state is TaskState.RESTARTING:
            out[name].append("restarting")
        if name in stalled:
            out[name].append("stalled")
            continue
        if state is not TaskState.RUNNING:
            continue
        rates = rates_by_job.get(job, [])
        if p.steps_per_sec is not None and len(rates) >= 2:
            median = statistics.median(rates)
            if median > 0 and p.steps_per_sec < STRAGGLER_RATIO * median:
                out[name].append("straggler")
    return out


@dataclass(frozen=True)
class TaskProgress:
    """What `status` shows of one task's training."""

    step: int | None
    steps_per_sec: float | None
    flags: tuple[str, ...]
    epoch: int | None = None
    quiet_for: float | None = None  # seconds since its newest step line (or its start, if none)


class RunProgress:
    """Progress of every task of a run, from the run's `progress` settings."""

    def __init__(self, settings: ProgressSpec) -> None:
        self.reader = ProgressReader(settings.regex, settings.window)
        self.results = ResultReader(settings.metrics)
        self.stall_timeout = settings.stall_timeout

    def rule(self) -> ProgressRule:
        """The progress lines and the result lines (`tf/results.py`), each their own kind of mark."""
        return ProgressRule(f"{self.results.pattern}|{self.reader.pattern}", self.reader.window)

    def assess(self, statuses: Sequence[TaskStatus]) -> dict[str, TaskProgress]:
        now = time.time()
        progress = {
            s.task: self.reader.read(
                s.marks, s.observed_at or now, s.uptime, s.state in (TaskState.RUNNING, TaskState.RESTARTING)
            )
            for s in statuses
        }
        found = flags([(s.task, s.job, s.state) for s in statuses], progress, self.stall_timeout)
        return {
            s.task: TaskProgress(
                progress[s.task].step,
                progress[s.task].steps_per_sec,
                tuple(found[s.task]),
                progress[s.task].epoch,
                progress[s.task].quiet_for,
            )
            for s in statuses
        }


TRAINING_JOBS = ("chief", "worker")  # the jobs whose output shows training progress
UNREAD_AFTER = 60.0  # seconds a task prints before its output is taken to show no progress tfctl reads


def unread_progress(statuses: Sequence[TaskStatus], progress: Mapping[str, TaskProgress]) -> list[str]:
    """Running training tasks that print, for a minute now, but nothing read as a step, an
    epoch or a rate (bare arrays, a format of their own): `progress.regex` would read them."""
    return [
        s.task
        for s in statuses
        if s.job in TRAINING_JOBS
        and s.state is TaskState.RUNNING
        and s.last_line
        and (s.uptime or 0) > UNREAD_AFTER
        and progress[s.task].step is None
        and progress[s.task].epoch is None
        and progress[s.task].steps_per_sec is None
    ]


def never_stepped(statuses: Sequence[TaskStatus], progress: Mapping[str, TaskProgress]) -> dict[str, list[str]]:
    """Ended tasks that logged no step in a job whose other tasks did -> those other tasks: a
    worker that never trained hides behind a success policy that only watches the chief."""
    stepped: dict[str, list[str]] = {}
    for s in statuses:
        if progress[s.task].step is not None:
            stepped.setdefault(s.job, []).append(s.task)
    return {
        s.task: stepped[s.job] for s in statuses if s.final and progress[s.task].step is None and stepped.get(s.job)
    }
