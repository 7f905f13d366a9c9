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


def sacct_argv(job_ids: Sequence[str]) -> list[str]:
    """One line per allocation (a heterogeneous job's components: one each), none per step."""
    return [
        *("sacct", "--parsable2", "--noheader", "--allocations"),
        *(f"--jobs={','.join(job_ids)}", f"--format={','.join(FORMAT)}"),
    ]


def slurm_accounting(job_ids: Sequence[str], run: Runner = run_slurm) -> dict[str, Any]:
    """`{"source": "sacct", "enabled": True, "allocations": [...], "total": {...}}`, or
    `{"source": "sacct", "enabled": False, "why": ...}` where Slurm keeps no accounting."""
    try:
        result = run(sacct_argv(job_ids), None)
    except SlurmError as e:
        return off(e.message)
    if result.returncode != 0:
        return off((result.stderr or result.stdout).strip().replace("sacct: error: ", "") or "sacct failed")
    return parse(result.stdout, job_ids)


def off(why: str) -> dict[str, Any]:
    return {"source": "sacct", "enabled": False, "why": why}


def parse(out: str, job_ids: Sequence[str]) -> dict[str, Any]:
    """sacct's lines, summed per allocation (`5+0` and `5+1` are one), in the order of `job_ids`."""
    found: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != len(FORMAT):
            continue
        job, state, elapsed, cpu, tres = fields
        job_id = job.partition("+")[0]
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
