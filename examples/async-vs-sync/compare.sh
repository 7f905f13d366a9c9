#!/bin/sh
# Train the same model async and then sync on the same 1 ps + 2 worker cluster (through
# `tfctl up`), then print one table row per mode from the chief's final summary line.
# Usage: ./compare.sh            (TFCTL="python -m tfctl" ./compare.sh if tfctl is not on PATH)
set -u
cd "$(dirname "$0")"
TFCTL=${TFCTL:-tfctl}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for mode in async sync; do
  echo "== $mode: $TFCTL -f cluster-$mode.yaml up" >&2
  start=$(date +%s.%N)
  $TFCTL -f "cluster-$mode.yaml" up >"$out/$mode.out" 2>"$out/$mode.err"
  rc=$?
  end=$(date +%s.%N)
  echo "$rc $start $end" >"$out/$mode.rc"
  tail -n 2 "$out/$mode.err" >&2
  [ "$rc" -eq 0 ] || { status=1; tail -n 20 "$out/$mode.out" >&2; }
done
python3 - "$out" <<'PY'
import re, sys
from pathlib import Path
out = Path(sys.argv[1])
final = re.compile(r"^\[worker:0\]\s+final step (\d+) loss (\S+) accuracy ([\d.]+) time ([\d.]+)s steps/s ([\d.]+)"
                   r" checkpoint \S+ mode (\w+) examples/s ([\d.]+)", re.M)
rows = []
for mode in ("async", "sync"):
    rc, start, end = (out / f"{mode}.rc").read_text().split()
    m = final.search((out / f"{mode}.out").read_text())
    if m:
        step, loss, acc, secs, rate, _, ex = m.groups()
        rows.append((mode, acc, step, loss, secs, rate, ex, f"{float(end) - float(start):.1f}", rc))
    else:
        rows.append((mode, "-", "-", "-", "-", "-", "-", f"{float(end) - float(start):.1f}", rc))
head = ("mode", "test accuracy", "global steps", "last loss", "train time s", "steps/s", "examples/s", "tfctl up s", "exit")
widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
for r in [head] + rows:
    print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
PY
exit $status
