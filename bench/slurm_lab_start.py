"""What Slurm's accounting adds to the Slurm lab's start-up (bench/slurm_lab.py): the lab
started and closed `--attempts` times without accounting and with it (MariaDB, slurmdbd, the
cluster registered), alternating so that both see the same machine. Prints the median and spread
of each, and of the part spent starting MariaDB and slurmdbd; with --json, the samples.

    sudo python -m bench.slurm_lab_start --attempts 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.slurm_lab import SlurmLab


def started(work: Path, accounting: bool) -> tuple[float, float]:
    """Seconds until every slurmd registered, and of those, starting the accounting daemons."""
    began = time.monotonic()
    with SlurmLab(work, accounting=accounting, prefix="tfctl-sa", bridge="tfctlbr45", subnet="10.77.45") as lab:
        return time.monotonic() - began, lab.accounting_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the samples as JSON")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {"without": [], "with": [], "with: accounting daemons": []}
    with tempfile.TemporaryDirectory(prefix="tfctl-lab-start-") as tmp:
        for attempt in range(args.attempts):
            samples["without"].append(started(Path(tmp) / f"plain{attempt}", False)[0])
            total, daemons = started(Path(tmp) / f"acct{attempt}", True)
            samples["with"].append(total)
            samples["with: accounting daemons"].append(daemons)
    if args.json:
        print(json.dumps(samples))
        return
    print(f"Slurm lab start-up, {args.attempts} attempts each (median, min-max)")
    for name, values in samples.items():
        print(f"  {name:<26} {statistics.median(values):6.1f} s  ({min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
