"""The benchmark's report: Markdown tables of medians, ratios to pdsh, CPU, and breakdowns.

Pure formatting of what bench/fanout.py measured; see bench/README.md for how to read it.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from bench.lab import Sample
from bench.tracefile import Summary

VERBS3 = ("up", "status", "down")
TARGETS = {"up": 2.0, "status": 1.0, "down": 2.0}
TARGET_N = 16
# tfctl progress line: "[  1.2s] worker:0     running (pid 123)" (who padded to 12 columns)
STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)s\] (.*)$")
NAN = float("nan")

Say = Callable[[str], None]


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else NAN


def fmt(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def samples_text(xs: Iterable[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs)


@dataclass
class Traced:
    """One traced tfctl command: how it ran, and what its trace file says it did."""

    sample: Sample
    summary: Summary


@dataclass
class Results:
    """Everything one benchmark run measured, by tree and cluster size."""

    trees: list[Path]
    labels: dict[Path, str]
    sizes: list[int]
    repeat: int
    warmup: int
    settle: float
    floor: dict[int, dict[str, list[Sample]]] = field(default_factory=dict)  # n -> pdsh/seq -> samples
    rows: dict[Path, dict[int, dict[str, list[Sample]]]] = field(default_factory=dict)  # tree -> n -> verb
    cold: dict[Path, dict[int, dict[str, float]]] = field(default_factory=dict)  # first warm-up walls
    watch: dict[Path, dict[int, list[dict]]] = field(default_factory=dict)  # watcher CPU rates per cycle
    traces: dict[Path, dict[int, dict[str, Traced]]] = field(default_factory=dict)  # tree -> n -> verb


def walls(samples: list[Sample]) -> float:
    return median(x.wall for x in samples)


def report(r: Results, host_names: list[str], say: Say) -> None:
    """Every table, in the order bench/README.md describes them."""
    wall_tables(r, say)
    all_samples(r, say)
    cpu_table(r, say)
    watcher_load(r, say)
    up_breakdowns(r, say)
    for tree in r.trees:
        for n, traced in r.traces[tree].items():
            if traced:
                trace_tables(n, host_names[:n], traced, r.labels[tree], say)
            else:
                say(
                    f"\n(N={n}, tfctl {r.labels[tree]}: no SSH traffic table, its traced cycle left no trace file: "
                    "this tree predates TFCTL_TRACE.)"
                )


def wall_tables(r: Results, say: Say) -> None:
    tn = TARGET_N if TARGET_N in r.sizes else r.sizes[-1]
    for tree in r.trees:
        say(f"\n## Wall time, median of {r.repeat} (seconds), tfctl {r.labels[tree]}\n")
        say(
            "| N | pdsh true (s) | sequential ssh (s) | pdsh launch (s) | tfctl up (s) | tfctl status (s) "
            "| tfctl down (s) | up/pdsh | status/pdsh | down/pdsh | up/pdsh launch |"
        )
        say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for n in r.sizes:
            p, q, launch = (walls(r.floor[n][k]) for k in ("pdsh", "seq", "launch"))
            m = {k: walls(r.rows[tree][n][k]) for k in VERBS3}
            say(
                f"| {n} | {p:.2f} | {q:.2f} | {launch:.2f} | {m['up']:.2f} | {m['status']:.2f} | {m['down']:.2f} | "
                f"{m['up'] / p:.2f}x | {m['status'] / p:.2f}x | {m['down'] / p:.2f}x | {m['up'] / launch:.2f}x |"
            )
        say(f"\nTargets at N={tn}" + ("" if tn == TARGET_N else f" (N={TARGET_N} not measured)") + ":")
        p = walls(r.floor[tn]["pdsh"])
        for verb, limit in TARGETS.items():
            v = walls(r.rows[tree][tn][verb])
            say(
                f"- {verb}: {v:.2f}s = {v / p:.2f}x pdsh ({p:.2f}s); target <= {limit:g}x: "
                f"{'MET' if v / p <= limit else 'NOT MET'}"
            )


def all_samples(r: Results, say: Say) -> None:
    say("\nAll samples (s):")
    for n in r.sizes:
        say(
            f"  N={n}: pdsh [{samples_text(x.wall for x in r.floor[n]['pdsh'])}]; "
            f"seq [{samples_text(x.wall for x in r.floor[n]['seq'])}]; "
            f"pdsh launch [{samples_text(x.wall for x in r.floor[n]['launch'])}]"
        )
        for tree in r.trees:
            say(
                f"  N={n} {r.labels[tree]}: "
                + "; ".join(f"{k} [{samples_text(x.wall for x in r.rows[tree][n][k])}]" for k in VERBS3)
            )
    if r.warmup:
        say(
            "Warm-up round (first contact: supervisor zipapp upload and code sync to hosts not used before; "
            "not in the medians):"
        )
        for tree in r.trees:
            say(
                f"  {r.labels[tree]}: "
                + "; ".join(
                    f"N={n} " + ", ".join(f"{k} {v:.2f}s" for k, v in c.items()) for n, c in r.cold[tree].items()
                )
            )


def cpu_table(r: Results, say: Say) -> None:
    say(
        "\n## CPU seconds, median (ctl = the command and its children on the controller; hosts = sshd "
        "sessions, shells and supervisor processes reaped on the lab hosts, all of which share this "
        "machine's CPUs)\n"
    )
    say(
        "| N | tfctl | pdsh ctl | pdsh hosts | seq ssh ctl | seq ssh hosts | up ctl | up hosts | status ctl "
        "| status hosts | down ctl | down hosts |"
    )
    say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def cells(samples: list[Sample]) -> list[str]:
        return [fmt(median(x.cpu for x in samples)), fmt(median(x.host_cpu for x in samples))]

    for n in r.sizes:
        floor = cells(r.floor[n]["pdsh"]) + cells(r.floor[n]["seq"])
        for tree in r.trees:
            tfctl = [c for k in VERBS3 for c in cells(r.rows[tree][n][k])]
            say(f"| {n} | {r.labels[tree]} | " + " | ".join(floor + tfctl) + " |")
    say(
        "(A host's sshd only adds a session's CPU once the connection closes: `up`'s count misses the "
        "task and monitor processes, still running; `down`'s includes them and the detached watcher's "
        "work since `up`.)"
    )


def watcher_load(r: Results, say: Say) -> None:
    if not any(r.watch[t] for t in r.trees):
        return
    say(
        "\nDetached watcher after `up -d`, CPU seconds per second (median), in the first and second "
        f"half of the {r.settle:g}s pause: the watcher process itself / everything on the lab hosts "
        "(its sessions and supervisors, the tasks and their monitors):"
    )
    for tree in r.trees:
        for n, ws in r.watch[tree].items():
            f = [median(w[k][i] for w in ws) for k in ("first", "second") for i in (0, 1)]
            say(f"  {r.labels[tree]} N={n}: first {f[0]:.2f} / {f[1]:.2f}, then {f[2]:.2f} / {f[3]:.2f}")


def up_breakdowns(r: Results, say: Say) -> None:
    for tree in r.trees:
        for n in r.sizes:
            ups = sorted(r.rows[tree][n]["up"], key=lambda x: x.wall)
            sample = ups[len(ups) // 2]
            say(
                f"\n## Where one `up` spends its time, N={n}, tfctl {r.labels[tree]} (the median run, "
                f"{sample.wall:.2f}s)\n"
            )
            say("| milestone | tfctl stamp (s) | at (s) | step (s) | what the step did |")
            say("| --- | --- | --- | --- | --- |")
            for name, stamp, at, step, what in up_breakdown(sample.lines, n, sample.wall):
                say(f"| {name} | {'-' if stamp is None else f'{stamp:.1f}'} | {fmt(at)} | {fmt(step)} | {what} |")
        say(
            "(at: when the line reached this benchmark, counted from spawning `python -m tfctl`; tfctl's "
            "own stamp counts from after its start-up, with 0.1 s resolution.)"
        )


def up_breakdown(
    lines: list[tuple[float, str]], n: int, wall: float
) -> list[tuple[str, float | None, float, float, str]]:
    """Milestones of one `up` from its progress lines: (name, tfctl stamp, arrival, step, what)."""
    parsed = []
    for at, line in lines:
        m = STAMP.match(line)
        if m:
            parsed.append((float(m.group(1)), at, m.group(2)))

    def find(pattern: str, last: bool = False) -> tuple[float | None, float | None]:
        hits = [(s, a) for s, a, text in parsed if re.search(pattern, text)]
        return (hits[-1] if last else hits[0]) if hits else (None, None)

    steps = [
        (
            "tfctl started",
            (None, lines[0][0] if lines else None),
            "interpreter + imports + cluster file + plan (first stderr line)",
        ),
        (
            "all hosts connected",
            find(r"ok: python", last=True),
            f"preflight: {n} paramiko handshakes, each host's `serve` conversation (zipapp upload if missing), `info`",
        ),
        ("ports checked", find(r"syncing "), "supervisor `ports` per host"),
        ("synced", find(r"synced: ", last=True), "supervisor `sync_plan` + `sync_apply` per host"),
        ("ps running", find(r"^ps:0\s+running"), "supervisor `start` on host 0"),
        ("ps listening", find(r"^ps:0\s+listening"), "supervisor `status` polls (0.2 s apart) on host 0"),
        ("reachability ok", find(r"reachability: "), f"supervisor `probe` on {n} hosts"),
        ("worker:0 listening", find(r"^worker:0\s+listening"), "supervisor `start` + `status` polls on host 0"),
        ("all running", find(r"all \d+ tasks running"), f"supervisor `start` for the other {n - 1} workers"),
        (
            "process exit",
            (None, wall),
            "hand the run to the forked watcher (or, older trees: spawn one, close connections), exit",
        ),
    ]
    out, prev = [], 0.0
    for name, (stamp, arrived), what in steps:
        if arrived is None:
            out.append((name, stamp, NAN, NAN, what))
            continue
        out.append((name, stamp, arrived, arrived - prev, what))
        prev = arrived
    return out


def trace_tables(n: int, names: list[str], traced: dict[str, Traced], label: str, say: Say) -> None:
    """What one traced up/status/down did over SSH, from tfctl's own trace files."""
    say(f"\n## SSH traffic of one traced up/status/down, N={n}, tfctl {label}\n")
    say(
        "| verb | process wall (s) | before the first span / spans / after the last span (s) "
        "| controller CPU (s) | handshakes | handshake median / max (s) | supervisor calls | exec channels "
        "| calls per host (host 0 / last) | channels per host (host 0 / last) |"
    )
    say("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for verb, t in traced.items():
        s, wall = t.summary, t.sample.wall
        before, spans = s.first - t.sample.spawned, s.last - s.first
        hs = [c.seconds for c in s.connects]
        cph, chh = s.calls_per_host, s.channels_per_host
        say(
            f"| {verb} | {wall:.2f} | {fmt(before)} / {fmt(spans)} / {fmt(wall - before - spans)} "
            f"| {t.sample.cpu:.2f} | {len(hs)} | {fmt(median(hs))} / {fmt(max(hs, default=NAN))} "
            f"| {len(s.calls)} | {len(s.channels)} | {len(cph.get(names[0], []))} / {len(cph.get(names[-1], []))} "
            f"| {len(chh.get(names[0], []))} / {len(chh.get(names[-1], []))} |"
        )
    say("\n| tfctl verb: what | count | net median (s) | net max (s) | net sum (s) | gross median (s) |")
    say("| --- | --- | --- | --- | --- | --- |")
    for verb, t in traced.items():
        for row in t.summary.rows:
            nets, gross = [x[0] for x in row.times], [x[1] for x in row.times]
            say(
                f"| {verb}: {row.kind} `{row.label}` | {len(nets)} | {median(nets):.3f} | {max(nets):.3f} "
                f"| {sum(nets):.2f} | {median(gross):.3f} |"
            )
    say(
        "(gross: as the caller waited. net: without the SSH handshakes and channel openings it triggered -- "
        "with one exec per call, all of a call's time is its channel's; with one conversation per host, the "
        "first call on a host still includes the remote interpreter's start-up --; an exec channel or a put "
        "without the handshake it triggered; a stream only until its channel is open.)"
    )
    if "up" in traced:
        s = traced["up"].summary
        say("")
        for name in dict.fromkeys([names[0], names[-1]]):
            say(
                f"up on {name}: supervisor calls: {', '.join(s.calls_per_host.get(name, [])) or '-'}; "
                f"SSH commands: {', '.join(s.channels_per_host.get(name, [])) or '-'}"
            )
    for verb, t in traced.items():
        s, conn = t.summary, t.summary.connects
        steps = ", ".join(f"{k} {v:.2f}s" for k, v in s.steps.items())
        if conn:
            say(
                f"{verb}: handshakes from {min(c.start for c in conn) - t.sample.spawned:.2f}s to "
                f"{max(c.end for c in conn) - t.sample.spawned:.2f}s after spawning the process"
                + (f"; {steps}" if steps else "")
            )
        elif steps:
            say(f"{verb}: {steps}")
