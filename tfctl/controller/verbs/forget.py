"""`tfctl runs --prune`: forget old ended runs, here and on their hosts.

A run's files on a host (task records and logs, the synced workdir, checkpoints under
$TFCTL_RUN_DIR) stay after it ends, so it can be looked at and resumed; pruning removes those of
all but the newest ended runs of each cluster file, then the run's local record. A host that
cannot be reached keeps its files, and the run keeps its record, so a later prune finishes.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from tfctl.backends.base import PruneTarget, backend_for
from tfctl.cluster.agent import open_agent
from tfctl.cluster.group import fan_out
from tfctl.runs import transitions
from tfctl.runs.record import RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import PruneAnswer, PruneRequest

DEFAULT_KEEP = 10
PRUNE_TIMEOUT = 600.0  # removing a large checkpoint directory takes a while


def candidates(records: Iterable[RunRecord], keep: int, older_than: float | None, now: float) -> list[RunRecord]:
    """Ended runs beyond the newest `keep` of their cluster file (and, with `older_than`,
    ended at least that many seconds before `now`), oldest first. Live runs never are."""
    ended: dict[str, list[RunRecord]] = defaultdict(list)
    for r in records:
        if not r.active:
            ended[r.cluster_file].append(r)
    chosen = []
    for runs in ended.values():
        runs.sort(key=lambda r: r.created_at)
        for r in runs[: max(0, len(runs) - keep)]:
            if older_than is None or (r.ended_at or r.created_at) <= now - older_than:
                chosen.append(r)
    return sorted(chosen, key=lambda r: r.created_at)


@dataclass
class RunPruned:
    """One run: its files on each host that answered, and what stopped it from being forgotten."""

    record: RunRecord
    paths: dict[str, list[str]] = field(default_factory=dict)  # host -> paths
    containers: dict[str, list[str]] = field(default_factory=dict)  # host -> containers the run left there
    size: int = 0
    problems: list[str] = field(default_factory=list)  # "host: why"; none: the record is gone too

    @property
    def complete(self) -> bool:
        return not self.problems


@dataclass
class PruneReport:
    runs: list[RunPruned]
    unreachable: dict[str, str]  # host -> error
    dry_run: bool

    @property
    def clean(self) -> bool:
        return not self.unreachable and all(r.complete for r in self.runs)

    def to_json(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "runs": [
                {
                    "run_id": r.record.run_id,
                    "file": r.record.cluster_file,
                    "state": r.record.state.value,
                    "created_at": r.record.created_at,
                    "ended_at": r.record.ended_at,
                    "paths": r.paths,
                    "containers": r.containers,
                    "bytes": r.size,
                    "removed": r.complete and not self.dry_run,
                    "problems": r.problems,
                }
                for r in self.runs
            ],
            "unreachable": self.unreachable,
        }


def prune(store: RunStore, records: list[RunRecord], dry_run: bool = False) -> PruneReport:
    """Remove the runs' files on every host of theirs at once, then the records of the runs whose
    every host answered and removed everything."""
    hosts: dict[str, tuple[PruneTarget, list[str]]] = {}  # label -> (where, its runs)
    labels: dict[str, str] = {}  # the spec as JSON -> its label
    for r in records:
        for target in _holders(r):
            key = _key(target)
            if key not in labels:
                label = target.spec.name
                while label in hosts:  # the same name reached two ways, by two cluster files
                    label += "'"
                labels[key] = label
                hosts[label] = (target, [])
            hosts[labels[key]][1].append(r.run_id)
    result = [RunPruned(r) for r in records]
    with contextlib.ExitStack() as stack:
        agents = {label: stack.enter_context(open_agent(target.spec)) for label, (target, _) in hosts.items()}
        answers = fan_out(
            list(hosts),
            lambda label: label,
            lambda label: agents[label].call(
                PruneRequest(hosts[label][1], dry_run, every_host=hosts[label][0].every_host),
                timeout=PRUNE_TIMEOUT,
            ),
        )
    unreachable = {  # without the host's name in front: the report names it
        label: str(getattr(e, "message", e)).removeprefix(f"{hosts[label][0].spec.name}: ")
        for label, e in answers.failed.items()
    }
    for run in result:
        for target in _holders(run.record):
            label = labels[_key(target)]
            _note(run, label, answers.succeeded.get(label))
        if run.complete and not dry_run:
            transitions.forget(store, run.record.run_id)  # and what it kept beside it (the watcher's log)
    return PruneReport(result, unreachable, dry_run)


def _holders(record: RunRecord) -> tuple[PruneTarget, ...]:
    """Where a run's files are removed from, as its backend says: its hosts, or a place that
    stands for all of them."""
    return backend_for(record.backend).prune_targets(record)


def _key(target: PruneTarget) -> str:
    """One key per way of reaching one place, so two runs there are pruned in one request."""
    return json.dumps({**target.spec.to_wire(), "every_host": target.every_host}, sort_keys=True)


def _note(run: RunPruned, host: str, answer: PruneAnswer | None) -> None:
    run_id = run.record.run_id
    if answer is None:
        run.problems.append(f"{host} could not be reached")
    elif run_id in answer.kept:
        run.problems.append(f"{host}: {answer.kept[run_id]}")
    else:
        run.paths[host] = answer.paths.get(run_id, [])
        run.size += answer.sizes.get(run_id, 0)
        if answer.containers.get(run_id):
            run.containers[host] = answer.containers[run_id]
