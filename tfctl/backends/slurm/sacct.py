"""What Slurm's own accounting recorded of a run's allocations (`sacct`): per allocation its
state, elapsed time, CPU-hours and GPU-hours, then their totals; or, where the cluster keeps no
accounting, that it is off and why (tfctl's own figures stand alone then).

The figures are the shape `tfctl.runs.accounting.scheduler_text` reads, so `status --json`,
the report and `runs --json` show them beside tfctl's."""

from __future__ import annotations

from typing import Any, Sequence

from tfctl.backends.slurm.allocation import Runner, SlurmError, run_slurm
from tfctl.runs.accounting import HOUR

FORMAT = ("JobID", "State", "ElapsedRaw", "CPUTimeRAW", "AllocTRES")
# Slurm's job states that no longer change; the others (RUNNING, PENDING, REQUEUED...) still do.
ENDED = frozenset(
    ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT")
)


def sacct_argv(job_ids: Sequence[str]) -> list[str]:
    """One line per allocation (a heterogeneous job's components: one each), none per step."""
    return [
        *("sacct", "--parsable2", "--noheader", "--allocations"),
        *(f"--jobs={','.join(job_ids)}", f"--format={','.join(FORMAT)}"),
    ]


def slurm_accounting(job_ids: Sequence[str], run: Runner = run_slurm, components: int = 1) -> dict[str, Any]:
    """`{"source": "sacct", "enabled": True, "settled": ..., "allocations": [...], "total": {...}}`,
    or `{"source": "sacct", "enabled": False, "why": ...}` where Slurm keeps no accounting.
    `components`: of each allocation (a heterogeneous job's), all recorded before it is settled."""
    try:
        result = run(sacct_argv(job_ids), None)
    except SlurmError as e:
        return off(e.message)
    if result.returncode != 0:
        return off((result.stderr or result.stdout).strip().replace("sacct: error: ", "") or "sacct failed")
    return parse(result.stdout, job_ids, components)


def off(why: str) -> dict[str, Any]:
    return {"source": "sacct", "enabled": False, "why": why}


def parse(out: str, job_ids: Sequence[str], components: int = 1) -> dict[str, Any]:
    """sacct's lines, summed per allocation (`5+0` and `5+1` are one), in the order of `job_ids`.
    Settled once every component of every allocation is recorded as ended (slurmdbd hears of
    each a moment after slurmctld; the controller in its allocation asks while that still runs):
    readers ask again until then."""
    found: dict[str, dict[str, Any]] = {}
    changing: set[str] = set()  # allocations with a component whose state may still change
    seen: dict[str, set[str]] = {}  # allocation -> its components recorded
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != len(FORMAT):
            continue
        job, said, elapsed, cpu, tres = fields
        job_id, _, component = job.partition("+")
        seen.setdefault(job_id, set()).add(component)
        state = (said.split() or [""])[0]  # real sacct says `CANCELLED by 0`: by whom is no state
        if state not in ENDED:
            changing.add(job_id)
        seconds = _number(elapsed)
        gpus = _gpus(tres)
        entry = found.setdefault(
            job_id, {"id": job_id, "state": state, "elapsed_seconds": 0.0, "cpu_hours": 0.0, "gpu_hours": 0.0}
        )
        entry["elapsed_seconds"] = max(entry["elapsed_seconds"], seconds)
        entry["cpu_hours"] += _number(cpu) / HOUR
        entry["gpu_hours"] += gpus * seconds / HOUR
    allocations = [_rounded(found[job]) for job in job_ids if job in found]
    total = {key: sum(a[key] for a in allocations) for key in ("elapsed_seconds", "cpu_hours", "gpu_hours")}
    missing = [job for job in job_ids if job not in found]
    return {
        "source": "sacct",
        "enabled": True,
        "settled": not missing and all(job not in changing and len(seen[job]) >= components for job in job_ids),
        "allocations": allocations,
        "total": _rounded(total),
        **({"missing": missing} if missing else {}),
    }


def _number(text: str) -> float:
    return float(text) if text.isdigit() else 0.0


def _gpus(tres: str) -> int:
    """`cpu=2,gres/gpu=2,mem=2000M,node=1` -> 2."""
    for item in tres.split(","):
        name, _, count = item.partition("=")
        if name == "gres/gpu" and count.isdigit():
            return int(count)
    return 0


def _rounded(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        **entry,
        **{key: round(entry[key], 4) for key in ("cpu_hours", "gpu_hours")},
        "elapsed_seconds": round(entry["elapsed_seconds"], 1),
    }
