"""What `tfctl report` draws, gathered from the run's hosts when it is asked for.

The hosts, not a file the controller writes during the run, are the source: a task's host keeps
its state after the run ended (as `tfctl logs` reads it), and only the host sees everything that
happens to a task. Its monitor restarts a task by itself, in less time than a controller's poll
(and whether any controller is alive at all), and records each earlier run's start and end
(`TaskInfo.attempts`); its output lines carry their write times (`supervisor/timeline.py`), so one
`status` with a progress rule over the whole run returns when each task listened (TF's
`Started server` line) and every step it logged, thinned to a few dozen marks per task, and
what its process tree used over its life (`supervisor/usage.py`). So the timeline is the same
for an attached run, a detached one, and one whose controller died.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any, Mapping, Sequence

from tfctl.backends.base import backend_for
from tfctl.cluster.cluster import Cluster
from tfctl.config.model import host_port
from tfctl.controller.views.report import Event, Resources, RunReport, Span, TaskReport
from tfctl.controller.views.status_view import silent_tasks
from tfctl.engine.observed import TaskStatus, describe_end, signal_name
from tfctl.errors import TfctlError
from tfctl.runs import transitions
from tfctl.runs.accounting import scheduler_text, unsettled
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import Mark, ProgressRule, RunState, TaskState
from tfctl.tf.doctor import TAIL_LINES, diagnose_run
from tfctl.tf.progress import SERVER_STARTED, ProgressReader, RunProgress, never_stepped
from tfctl.tf.results import ResultReader, kept_result, metrics
from tfctl.transport.specs import LocalSpec

LISTENING = "listening"  # the kind of mark of a task's `Started server` line
MARGIN = 60.0  # seconds of output before the run's record was made that still count (clocks differ)
POINTS = 200  # marks of each kind per task over the run: the steps/s chart's resolution
RATE_SPAN = 10.0  # seconds: line times are exact to a second, so shorter spans swing the rate
TAIL_SHOWN = 20  # last lines shown of a task that failed or may not have trained
SECRET = re.compile(r"(?i)pass|secret|token|key|credential|auth|cookie")


def gather(cluster: Cluster) -> RunReport:
    """Every task's story, from one `status` per host."""
    record = cluster.record
    now = time.time()
    progress = RunProgress(record.progress)
    reader = progress.reader
    rule = whole_run(record, progress, now)
    statuses, unreachable = cluster.status(progress=rule, tail=TAIL_LINES, usage_points=POINTS, count_lines=True)
    found = diagnose_run(cluster, statuses)
    assessed = progress.assess(statuses)
    quiet = silent_tasks(record, statuses, assessed, found)
    silent = {
        **{
            task: f"never logged a training step, while {peers(names)} did: it may not have trained"
            for task, names in never_stepped(statuses, assessed).items()
        },
        **{task: s.text(not record.active) for task, s in quiet.items()},
    }
    tasks = []
    for s in statuses:
        finding = found.findings.get(s.task) or found.never_ready.get(s.task)
        diagnosis = (finding.cause, finding.fix) if finding else None
        if diagnosis is None and s.task in quiet:
            diagnosis = (quiet[s.task].cause, quiet[s.task].fix)
        told = diagnosis is not None or s.task in silent or s.state in (TaskState.FAILED, TaskState.LOST)
        tasks.append(
            dataclasses.replace(
                task_report(
                    s,
                    reader,
                    now,
                    results=progress.results,
                    diagnosis=diagnosis,
                    last_line=found.last_lines.get(s.task) or s.last_line,
                    stopped_by=stopped_by(record),
                ),
                note=silent.get(s.task, ""),
                tail=tuple((s.tail or ())[-TAIL_SHOWN:]) if told else (),
                cost=s.cost(now),
            )
        )
    untimed = [s.task for s in statuses if s.restarts > len(s.attempts)]
    notes = (
        (f"{', '.join(untimed)}: restarted before tfctl recorded when; their bars start at the last run",)
        if untimed
        else ()
    )
    return RunReport(
        run_id=record.run_id,
        cluster_name=record.cluster_name,
        cluster_file=record.cluster_file,
        backend=record.backend,
        local=all(h.transport.KIND == LocalSpec.KIND for h in record.hosts),
        state=record.state.value,
        reason=record.reason,
        started_at=record.created_at,
        ended_at=record.ended_at,
        generated_at=now,
        tasks=tuple(tasks),
        commands=tuple((t.name, t.command) for t in first_of_each_job(record.tasks)),
        tf_config=record.tasks[0].env.get("TF_CONFIG", "") if record.tasks else "",
        env=tuple(sorted(masked(record.tasks[0].env).items())) if record.tasks else (),
        versions=tuple(record.versions.items()),
        unreachable=tuple((host, str(getattr(e, "message", e))) for host, e in sorted(unreachable.items())),
        notes=notes,
        scheduler_cost=scheduler_cost(record),
        result=progress.results.read(statuses) or kept_result(record.result),
        params=record.params_text(),
        tracking=record.tracking_text(),
    )


def whole_run(record: RunRecord, progress: RunProgress, now: float) -> ProgressRule:
    """The marks of the run's whole life: back from now to its start, in buckets so fine that
    the run itself spans `POINTS`, with the `Started server` lines beside its progress."""
    window = now - record.created_at + MARGIN
    buckets = math.ceil(POINTS * window / max((record.ended_at or now) - record.created_at, 1.0))
    return ProgressRule(f"(?P<{LISTENING}>{SERVER_STARTED})|{progress.rule().pattern}", window, buckets)


def scheduler_cost(record: RunRecord) -> str:
    """What the run's scheduler recorded it cost, in a line; "" for a backend without one."""
    figures = scheduler_figures(record)
    return scheduler_text(figures) if figures is not None else ""


def scheduler_figures(record: RunRecord) -> dict[str, Any] | None:
    """The scheduler's own figures of the run: as kept when it stopped, or asked again when none
    were kept or those were unsettled (a controller in its allocation asks before that ends)."""
    kept = (record.accounting or {}).get(record.backend)
    if isinstance(kept, dict) and not unsettled(kept):
        return kept
    try:
        held = backend_for(record.backend).report(record)
    except TfctlError:  # the scheduler cannot be asked from here: what was kept stands
        held = None
    fresh = held.fields.get("accounting") if held is not None else None
    return fresh if isinstance(fresh, dict) else kept if isinstance(kept, dict) else None


def settle_scheduler_figures(store: RunStore, record: RunRecord) -> RunRecord:
    """An ended run whose scheduler figures were unsettled, with them asked again; kept in its
    record once settled, so the scheduler is asked until then only."""
    if record.active or not unsettled((record.accounting or {}).get(record.backend)):
        return record
    fresh = scheduler_figures(record)

    settled = transitions.settle_scheduler_figures(record.backend, fresh)
    shown = settled.change(record)
    if unsettled(fresh):
        return shown  # shown, not kept: asked again next time
    return transitions.apply(store, record.run_id, settled) or shown


def first_of_each_job(tasks: Sequence[TaskSpec]) -> list[TaskSpec]:
    """One task per job: the commands of a job's tasks differ only in their index."""
    seen: dict[str, TaskSpec] = {}
    for t in tasks:
        seen.setdefault(t.job, t)
    return list(seen.values())


def masked(env: Mapping[str, str]) -> dict[str, str]:
    """The task's environment for the page, TF_CONFIG apart (shown whole), with the values of
    names that look secret (tokens, passwords, keys) hidden."""
    return {k: "********" if SECRET.search(k) else v for k, v in env.items() if k != "TF_CONFIG"}


def peers(names: Sequence[str]) -> str:
    """`worker:0, worker:1`; many: `worker:0 and 47 others`."""
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} and {len(names) - 1} others"


def stopped_by(record: RunRecord) -> str:
    """Why tfctl stopped the tasks that were still running when the run ended (the page says
    what decided the job once, at its top)."""
    ended = {RunState.SUCCEEDED: "succeeded", RunState.FAILED: "failed"}.get(record.state)
    if ended is None:
        return record.reason or "tfctl down"
    return f"by tfctl once the job {ended}"


def task_report(
    s: TaskStatus,
    reader: ProgressReader,
    now: float,
    diagnosis: tuple[str, str] | None,
    last_line: str,
    stopped_by: str = "tfctl down",
    results: ResultReader | None = None,
) -> TaskReport:
    """One task's runs and moments from its host's answer (`s.marks` over the whole run); the
    model's curves leave out its final evaluation (`results`), which is the run's result."""
    listened = [m.time for m in s.marks if m.text and re.search(SERVER_STARTED, m.text)]
    steps = [m for m in s.marks if not re.search(SERVER_STARTED, m.text)]
    samples, _, _ = reader.samples(steps)
    numbers = model_numbers(steps, reader, results)
    curves = {name: [(t, value) for t, _, value in points] for name, points in numbers}
    spans = [Span(a.started_at, a.ended_at, "failed", a.end) for a in s.attempts]
    end = (
        describe_end(s.state, s.exit_code, s.signal, s.error, stop_reason=s.stop_reason, stopped_by=stopped_by)
        if s.final
        else s.state.value
    )
    if s.started_at is not None:
        ended = s.ended_at if s.final else None
        outcome = s.state.value if s.final else "running"
        spans.append(Span(s.started_at, ended, outcome, end if s.final else "still running"))
    events: list[Event] = []
    for i, span in enumerate(spans):
        stop = span.end if span.end is not None else now
        events.append(Event(span.start, "start" if i == 0 else "started again"))
        heard = [t for t in listened if span.start - 1 <= t <= stop + 1]
        if heard:
            events.append(Event(heard[0], "listening"))
        stepped = [(t, step) for t, step in samples if span.start - 1 <= t <= stop + 1]
        if stepped:
            events.append(Event(stepped[0][0], "first step", f"step {stepped[0][1]}"))
        if span.end is not None:
            restarted = i < len(spans) - 1
            events.append(Event(span.end, "restart" if restarted else "end", span.how))
    return TaskReport(
        name=s.task,
        address=host_port(s.host, s.port),
        state=s.state.value,
        end=end + (f" after {s.restarts} restart{'s' if s.restarts != 1 else ''}" if s.restarts else ""),
        spans=tuple(spans),
        events=tuple(events),
        rates=tuple(reader.history(steps, min_span=RATE_SPAN)),
        steps=tuple((t, float(step)) for t, step in samples),
        brief=brief_end(s, stopped_by),
        metrics=tuple((name, tuple(points)) for name, points in curves.items()),
        metric_steps=tuple((name, tuple(step for _, step, _ in points)) for name, points in numbers),
        step=samples[-1][1] if samples else None,
        restarts=s.restarts,
        resources=resources(s),
        diagnosis=diagnosis,
        last_line=last_line,
    )


def model_numbers(
    marks: Sequence[Mark], reader: ProgressReader, results: ResultReader | None = None
) -> list[tuple[str, list[tuple[float, int | None, float]]]]:
    """Each number the model logs with its steps (loss, accuracy, ...) in the task's marks, as
    (time, the step of its line, value), oldest first; its final evaluation (`results`) left
    out, which is the run's result, not a point of its curve, and TF's `Started server` lines."""
    found: dict[str, list[tuple[float, int | None, float]]] = {}
    for mark, step, _, _ in reader.each(marks):
        if re.search(SERVER_STARTED, mark.text) or results is not None and results.line(mark.text):
            continue  # `Started server with target: grpc://localhost:2222` reads as a number
        for name, value in metrics(mark.text).items():
            found.setdefault(name, []).append((mark.time, step, value))
    return list(found.items())


def brief_end(s: TaskStatus, stopped_by: str) -> str:
    """How a task ended in a few words, for the timeline's narrow column (the table says it whole):
    `stopped once the job succeeded`, `killed by SIGKILL`, `exited with code 1 after 2 restarts`."""
    if not s.final:
        return s.state.value
    if s.state is TaskState.STOPPED:
        why = stopped_by.removeprefix("by tfctl ") if stopped_by.startswith("by tfctl ") else f"by {stopped_by}"
        words = "stopped by its host" if s.stop_reason else f"stopped {why}"
    elif s.signal:
        words = f"killed by {signal_name(s.signal)}"
    elif s.state is TaskState.LOST:
        words = "lost"
    elif s.exit_code is not None and s.state is not TaskState.SUCCEEDED:
        words = f"exited with code {s.exit_code}"
    else:
        words = s.state.value
    return words + (f" after {s.restarts} restart{'s' if s.restarts != 1 else ''}" if s.restarts else "")


def resources(s: TaskStatus) -> Resources | None:
    """The task's CPU and memory over its life, as its monitor sampled them (None: never sampled)."""
    if not s.usage_history:
        return None
    return Resources(
        cpu=tuple((u.sampled_at, u.cpu_percent) for u in s.usage_history),
        memory=tuple((u.sampled_at, float(u.rss_bytes)) for u in s.usage_history),
    )
