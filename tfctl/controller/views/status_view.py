"""What `status` shows, gathered as plain data: the snapshot of every task with its progress,
diagnosis and silence. The run's live controller sends it through its door (`rpc_handlers`) as
plain values; the terminal that asked renders it (`status_table`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

from tfctl.backends.base import BackendReport, backend_for
from tfctl.cluster.cluster import Cluster
from tfctl.controller.views.plain import from_plain, to_plain
from tfctl.engine.observed import TaskStatus
from tfctl.runs.accounting import cost_json, unsettled
from tfctl.runs.record import RunRecord
from tfctl.supervisor.protocol import RunState, TaskState
from tfctl.tf.doctor import TAIL_LINES, RunDiagnosis, diagnose_run, finding_json
from tfctl.tf.noise import last_shown
from tfctl.tf.progress import RunProgress, TaskProgress
from tfctl.tf.results import Metric, kept_result, result_json
from tfctl.tf.silence import AT_END, Silence, outputs, silences


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything `status` shows, asked for once."""

    statuses: list[TaskStatus]
    unreachable: dict[str, str]  # host -> why it did not answer
    diagnosis: RunDiagnosis
    progress: dict[str, TaskProgress]
    backend: BackendReport | None = None  # what the run's backend says of its own state
    silent: dict[str, Silence] = dataclasses.field(default_factory=dict)  # `tf.silence`
    result: dict[str, Metric] = dataclasses.field(default_factory=dict)  # its final evaluation (`tf.results`)

    def cost(self, record: RunRecord) -> dict[str, Any]:
        """Wall time, CPU- and GPU-hours so far; for a stopped run, as counted when it stopped
        (its tasks' hosts may be gone since), with its scheduler's figures as said now while
        those kept were unsettled."""
        if record.accounting is not None and not record.active:
            fresh = self.backend.fields.get("accounting") if self.backend is not None else None
            if unsettled(record.accounting.get(record.backend)) and isinstance(fresh, dict):
                return {**record.accounting, record.backend: fresh}
            return record.accounting
        now = time.time()
        reached = [s.cost(now) for s in self.statuses if s.state is not TaskState.UNREACHABLE]
        return cost_json(reached, (record.ended_at or now) - record.created_at)

    def to_json(self, record: RunRecord, usage_history: bool = False) -> dict[str, Any]:
        run = {
            "id": record.run_id,
            "cluster": record.cluster_name,
            "file": record.cluster_file,
            "state": record.state.value,
            "reason": record.reason,
            "started_at": record.created_at,
            "ended_at": record.ended_at,
            "resumes": record.resumes,
            "allocations": {
                "now": len(record.allocations) + 1,
                "most": record.resubmits + 1,
                "ended": [end.to_wire() for end in record.allocations],
            },
            "unreachable_hosts": dict(sorted(self.unreachable.items())),
            "host_problems": host_problems(self.statuses),
            "spares": list(record.spares),
            "moves": [m.to_wire() for m in record.moves],
            "lost_hosts": [h.name for h in record.lost_hosts],  # left by a move, not yet seen to stop what they ran
            "accounting": self.cost(record),
            "result": result_json(self.result),
            "params": dict(record.params),
            "tracking": record.tracking_json(),
        }
        if self.backend is not None:
            run[record.backend] = dict(self.backend.fields)
        tasks = []
        for s in self.statuses:
            p = self.progress[s.task]
            tasks.append(
                {
                    **s.to_json(),
                    "step": p.step,
                    "steps_per_sec": p.steps_per_sec,
                    "epoch": p.epoch,
                    "flags": list(p.flags),
                    "diagnosis": finding_json(
                        self.diagnosis.findings.get(s.task) or self.diagnosis.never_ready.get(s.task)
                    )
                    or silence_json(self.silent.get(s.task), record.active),
                    **({"usage_history": [u.to_wire() for u in s.usage_history]} if usage_history else {}),
                }
            )
        return {"run": run, "tasks": tasks}

    def to_plain(self) -> dict[str, Any]:
        """As the run's controller sends it to the terminal that asked, which renders it."""
        return to_plain(self)

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Snapshot:
        return from_plain(cls, data)


def snapshot(cluster: Cluster, usage_history: int = 0) -> Snapshot:
    progress = RunProgress(cluster.record.progress)
    ended = not cluster.record.active  # its logs grow no more: counting their lines costs once
    statuses, unreachable = cluster.status(
        progress=progress.rule(), tail=TAIL_LINES, usage_history=usage_history, count_lines=ended
    )
    statuses = traceless(cluster.record, statuses)
    found = diagnose_run(cluster, statuses)
    statuses = [dataclasses.replace(s, last_line=found.last_lines.get(s.task) or s.last_line) for s in statuses]
    held = backend_for(cluster.record.backend).report(cluster.record)
    assessed = progress.assess(statuses)
    why = {host: str(getattr(e, "message", e)) for host, e in unreachable.items()}
    silent = silent_tasks(cluster.record, statuses, assessed, found)
    # Shown as `logs` shows the task: without the start-up lines it folds (the silence above reads them).
    statuses = [dataclasses.replace(s, last_line=last_shown(s.tail) or s.last_line) if s.tail else s for s in statuses]
    result = progress.results.read(statuses) or kept_result(cluster.record.result)
    return Snapshot(statuses, why, found, assessed, held, silent, result)


def silent_tasks(
    record: RunRecord, statuses: Sequence[TaskStatus], progress: Mapping[str, TaskProgress], found: RunDiagnosis
) -> dict[str, Silence]:
    """The tasks that printed nothing while their peers went on (`tf.silence`): once the run
    ended, after `silence.AT_END` seconds of it; while it runs, after its `hang_timeout`. A task
    whose log already says what it waits for is left to that diagnosis."""
    told = {*found.findings, *found.never_ready}
    least = AT_END if not record.active else record.hang_timeout or record.startup_timeout
    now = max((s.observed_at for s in statuses if s.observed_at is not None), default=time.time())
    quiet = silences(outputs(statuses, progress, found.last_lines), now, least)
    return {task: s for task, s in quiet.items() if task not in told}


def silence_json(silence: Silence | None, live: bool) -> dict[str, Any] | None:
    """A silent task's entry where `status --json` puts a diagnosis."""
    if silence is None:
        return None
    return {
        "kind": "silent",
        "cause": f"{silence.text(ended=not live)}; {silence.cause}",
        "fix": silence.fix,
        "evidence": silence.after,
        "peer": silence.peer,
    }


def traceless(record: RunRecord, statuses: list[TaskStatus]) -> list[TaskStatus]:
    """A task of a run past its start whose host has no trace of it is not `pending`: its folder
    there was deleted (or, in a start that failed, it never started). Shown as lost, saying so;
    a task moved to a spare is left pending while it starts there."""
    if record.state is RunState.STARTING:
        return statuses
    moved = {m.task for m in record.moves}
    return [
        dataclasses.replace(
            s,
            state=TaskState.LOST,
            error=f"no trace of it on {s.host} (its folder there was deleted, or it never started)",
        )
        if s.state is TaskState.PENDING and s.task not in moved
        else s
        for s in statuses
    ]


def host_problems(statuses: list[TaskStatus]) -> dict[str, str]:
    """host -> why its state directory refuses writes: its tasks' ends wait there, unrecorded."""
    return {s.host: s.host_problem for s in statuses if s.host_problem}
