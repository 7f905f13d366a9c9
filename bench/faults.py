"""The long fault-injection series: many cycles of bench/fault_lab.py, with the figures.

Each cycle starts a ps and two ticking workers on 3 simulated SSH hosts, injects one fault
(SIGKILL of the attached `up`, of the watcher, of a ps, of a worker with and without a restart
policy, of every tfctl process on a host; a link down for a moment; a host gone until the run
failed), lets tfctl clean up by itself, then checks that no process of the run is left on any
host, every task port is free and every line the tasks wrote reads back through `tfctl logs`.

    python -m bench.faults [--cycles 80] [--seed N] [--home own|shared|both]

Prints one line per cycle and a summary per home mode: cycles, seed, slowest and median
clean-up, lines compared, lines lost (must be 0). Needs root, like the netns tests.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.fault_lab import FAULTS, FaultError, FaultLab, series
from bench.netns_hosts import TestHostLab, require_netns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=80)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--home", choices=("own", "shared", "both"), default="both")
    parser.add_argument("--fault", action="append", choices=FAULTS, help="only these faults (repeatable)")
    args = parser.parse_args()
    require_netns()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    modes = ("own", "shared") if args.home == "both" else (args.home,)
    failed = False
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix=f"tfctl-faults-{mode}-") as tmp:
            work = Path(tmp)
            with TestHostLab(
                3,
                workdir=work / "lab",
                prefix="tfctl-bf",
                bridge="tfctlbr9",
                subnet="10.77.9",
                shared_home=mode == "shared",
            ) as lab:
                try:
                    results = series(FaultLab(lab, work / "runs"), seed, args.cycles, tuple(args.fault or FAULTS))
                except FaultError as e:
                    print(f"{mode} home: FAILED: {e}")
                    failed = True
                    continue
        for r in results:
            print(
                f"{mode:>6} {r.number:3d} {r.fault:<25} {r.cleanup_seconds:5.1f}s {r.state:<9} "
                f"{r.lines:5d} lines  {r.detail}"
            )
        cleanups = [r.cleanup_seconds for r in results]
        slowest = max(results, key=lambda r: r.cleanup_seconds)
        print(
            f"{mode} home: {len(results)} cycles, seed {seed}, faults {dict(Counter(r.fault for r in results))}; "
            f"clean-up median {statistics.median(cleanups):.1f}s, slowest {slowest.cleanup_seconds:.1f}s "
            f"({slowest.fault}); {sum(r.lines for r in results)} lines compared, "
            f"{sum(r.lines_lost for r in results)} lost"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
