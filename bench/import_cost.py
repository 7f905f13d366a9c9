"""What `import tfctl` costs a program that uses the Python API: a fresh interpreter importing
the package, side by side with one doing nothing (`python -c pass`) and with each --compare
tree importing its own, in turn (A B C A B C ...), so the ratios hold while the machine drifts.

    python -m bench.import_cost [--compare OTHER_TREE ...] [--repeat 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.report import median

HERE = Path(__file__).resolve().parents[1]


def once(command: list[str], tree: Path | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    began = time.perf_counter()
    subprocess.run(command, env=env, cwd=tree or HERE, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--compare", action="append", default=[], type=Path, help="another tfctl tree (a checkout)")
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args(argv)
    rows: dict[str, tuple[list[str], Path | None]] = {"python -c pass": ([sys.executable, "-c", "pass"], None)}
    for tree in [HERE, *args.compare]:
        rows[f"import tfctl ({tree})"] = ([sys.executable, "-c", "import tfctl"], tree.resolve())
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeat):
        for name, (command, tree) in rows.items():
            times[name].append(once(command, tree))
    base = median(times[f"import tfctl ({HERE})"])
    print("| command | median ms | vs this tree |")
    print("| --- | --- | --- |")
    for name, found in times.items():
        print(f"| `{name}` | {median(found) * 1000:.1f} | {median(found) / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
