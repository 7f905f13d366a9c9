"""Fan-out benchmark: tfctl up/status/down over SSH against the pdsh / ssh floor.

Creates a lab of simulated hosts (network namespaces each running a real sshd, see
bench/netns_hosts.py) and measures, side by side, for each N in --hosts (default 4 16):

* floor:  `pdsh -R ssh -w <N hosts> true` (parallel OpenSSH) and a sequential `ssh -F cfg h true` loop;
          and a bash launcher's `up -d`: one pdsh that starts the same tasks in the background;
* tfctl:  `python -m tfctl -f cluster.yaml up -d` (1 ps on host 0 + one worker per host, all
          tests/tasks/fake_task.py serving forever), then `status --json`, then `down`,
          each with a fresh TFCTL_HOME.

Every measurement is repeated --repeat times (after --warmup untimed rounds) and the median is
reported, with ratios to pdsh and the targets (status <= 1.0x, up and down <= 2x pdsh at N=16).
Then: a per-phase breakdown of one `up` (from the `[ 1.2s] who  message` progress lines tfctl
prints on stderr), the SSH traffic of one extra up/status/down run with TFCTL_TRACE set (handshakes,
exec channels and supervisor calls per verb, from tfctl's own trace files), and micro-benchmarks
of the fixed costs (interpreter start-up, paramiko handshake, one exec channel, one supervisor call).

Needs root, pdsh, openssh-server, iproute2 (like the netns tests). Traffic goes only to the lab's
addresses. Every run is stopped (`tfctl down` in a finally), the lab hosts are checked for any
process carrying TFCTL_RUN_ID, and the lab is removed at the end.

    python -m bench.fanout [--hosts 4 16] [--repeat 3] [--warmup 1] [--settle 2]
                           [--src DIR] [--compare DIR ...] [--no-trace] [--no-micro] [--keep]

See bench/README.md for how to read the output; lab.py runs commands, tracefile.py reads traces,
report.py prints, micro.py holds the fixed costs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _src_arg() -> Path:
    """--src DIR (the tfctl source tree to benchmark), read before anything imports tfctl."""
    for i, arg in enumerate(sys.argv):
        if arg == "--src" and i + 1 < len(sys.argv):
            return Path(sys.argv[i + 1]).resolve()
        if arg.startswith("--src="):
            return Path(arg.split("=", 1)[1]).resolve()
    return REPO


SRC = _src_arg()
sys.path.insert(0, str(SRC))  # the tree under test, for what this process imports of tfctl
from bench import tracefile  # noqa: E402
from bench.lab import (  # noqa: E402
    SUBNET,
    TICK,
    Bench,
    BenchError,
    Sample,
    live_hosts_cpu,
    make_lab,
    proc_cpu_ticks,
    watcher_pid,
)
from bench.micro import micro  # noqa: E402
from bench.netns_hosts import TestHost, skip_reason  # noqa: E402
from bench.report import VERBS3, Results, Say, Traced, report  # noqa: E402


def tfctl_cycle(bench: Bench, n: int, src: Path, settle: float, trace: bool = False) -> dict:
    """up -d, status --json, down on the first n hosts; always downs; checks nothing is left.

    With `trace`, each command runs with TFCTL_TRACE naming its own file, read back into
    result["trace"][verb]. Returns the Samples by verb, the run id, and the watcher's load.
    """
    cluster = bench.cluster_file(n)
    hosts = bench.lab.hosts[:n]
    home = bench.new_home(n, src)
    env = {**bench.env_for(src), "TFCTL_HOME": str(home)}
    result: dict = {}
    problems: list[str] = []

    def run(*verb: str) -> Sample:
        e = {**env, "TFCTL_TRACE": str(home / f"trace-{verb[0]}.jsonl")} if trace else env
        sample = bench.timed([sys.executable, "-m", "tfctl", "-f", str(cluster), *verb], env=e, settle_hosts=hosts)
        result[verb[0]] = sample
        return sample

    try:
        up = run("up", "-d")
        if up.rc != 0:
            raise BenchError(f"tfctl up failed ({up.rc}):\n" + "\n".join(line for _, line in up.lines[-15:]))
        result["run_id"] = up.out.strip().splitlines()[-1]
        if settle:
            result["watcher"] = watcher_load(watcher_pid(home, result["run_id"]), hosts, settle)
        st = run("status", "--json")
        tasks = json.loads(st.out)["tasks"] if st.rc == 0 else []
        states = sorted({t["state"] for t in tasks})
        if st.rc != 0 or len(tasks) != n + 1 or states != ["running"]:
            raise BenchError(
                f"tfctl status: rc {st.rc}, {len(tasks)} tasks (want {n + 1}), states {states}:\n"
                + "\n".join(line for _, line in st.lines[-10:])
            )
    except BenchError as e:
        problems.append(str(e))  # reported with whatever down and the checks find
    finally:
        try:  # always, even after a failed or interrupted up
            down = run("down")
            text = "\n".join(line for _, line in down.lines)
            if down.rc != 0 and "no run of" not in text:
                problems.append(f"tfctl down failed ({down.rc}):\n" + "\n".join(line for _, line in down.lines[-15:]))
        except BenchError as e:
            problems.append(str(e))
        problems += bench.check_clean(home)
        if trace:
            result["trace"] = {}
            for verb in VERBS3:
                path = home / f"trace-{verb}.jsonl"
                if verb in result and path.exists():  # the watcher appends too: keep the command's own spans
                    sample = result[verb]  # and for `up -d`, those of the watcher starting the run for it
                    helper = watcher_pid(home, result["run_id"]) if verb == "up" and "run_id" in result else None
                    spans = tracefile.read(path, sample.pid, helper, sample.spawned + sample.wall)
                    result["trace"][verb] = Traced(result[verb], tracefile.summarize(spans))
        if problems:
            raise BenchError("\n".join(problems))
    return result


def watcher_load(pid: int | None, hosts: list[TestHost], settle: float) -> dict[str, tuple[float, float]]:
    """Sleep `settle` seconds, so the detached watcher's start-up burst (imports, N handshakes, N
    supervisor start-ups, all on this machine's CPUs here) is over before `status` is measured;
    returns its CPU per second and the hosts', in each half of the pause."""
    marks = []
    for i in range(3):
        if i:
            time.sleep(settle / 2)
        marks.append((proc_cpu_ticks(pid) if pid else 0, live_hosts_cpu(hosts), time.perf_counter()))
    return {
        half: ((w1 - w0) / TICK / (t1 - t0), (h1 - h0) / (t1 - t0))
        for half, (w0, h0, t0), (w1, h1, t1) in zip(("first", "second"), marks, marks[1:])
    }


def tree_label(src: Path) -> str:
    """A tfctl tree's name in the report: its commit (+ "dirty") in a git checkout, else its directory."""

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(src), *a], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") if (src / ".git").exists() else ""
    if not head:
        return src.name
    return head + ("+uncommitted" if git("status", "--porcelain", "--", "tfctl") else "")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[4, 16], help="cluster sizes (default: 4 16)")
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions per measurement (default 3)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed rounds per size first (agent upload, code sync, page cache; default 1)",
    )
    ap.add_argument("--src", default=str(REPO), help="tfctl source tree to benchmark (default: this repo)")
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="DIR",
        help="another tfctl source tree (e.g. `git archive COMMIT tfctl | tar -x -C DIR`) measured in "
        "the same rounds, interleaved, for a fair before/after under the same load; repeatable",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds between `up -d` and `status`, so the detached watcher's start-up burst is "
        "over (default 2; 0 = back to back)",
    )
    ap.add_argument(
        "--reuse-home",
        action="store_true",
        help="one TFCTL_HOME per size and tree, so each `up -d` follows a finished run (a user's second run)",
    )
    ap.add_argument("--no-trace", action="store_true", help="skip the traced extra up/status/down")
    ap.add_argument("--no-micro", action="store_true", help="skip the fixed-cost micro-benchmarks")
    ap.add_argument("--keep", action="store_true", help="keep the bench workdir (lab keys, logs, homes)")
    args = ap.parse_args()
    args.hosts = sorted(set(args.hosts))
    if args.hosts[0] < 1 or args.hosts[-1] > 200 or args.repeat < 1:
        ap.error("host counts must be 1..200 and --repeat >= 1")
    args.trees = [SRC] + [Path(d).resolve() for d in args.compare]
    for tree in args.trees:
        if not (tree / "tfctl" / "__main__.py").exists():
            ap.error(f"{tree} holds no tfctl package (tfctl/__main__.py)")
    return args


def measure(bench: Bench, args: argparse.Namespace, r: Results, say: Say) -> None:
    """Warm-up, then the timed rounds (floor and every tree, interleaved), then one traced cycle."""
    for tree in r.trees:
        where = subprocess.run(
            [sys.executable, "-c", "import tfctl; print(tfctl.__file__)"],
            env=bench.env_for(tree),
            cwd=bench.work,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not where.startswith(str(tree)):
            raise BenchError(f"`python -m tfctl` would import {where}, not the tree in {tree}")
    for n in r.sizes:
        r.floor[n] = {"pdsh": [], "seq": [], "launch": []}
        for tree in r.trees:
            r.rows[tree][n] = {k: [] for k in VERBS3}
        for _ in range(args.warmup):
            bench.pdsh(n)
            for tree in r.trees:
                c = tfctl_cycle(bench, n, tree, args.settle)
                r.cold[tree].setdefault(n, {k: c[k].wall for k in VERBS3 if k in c})
        for i in range(args.repeat):
            r.floor[n]["pdsh"].append(bench.pdsh(n))
            r.floor[n]["seq"].append(bench.sequential_ssh(n))
            r.floor[n]["launch"].append(bench.pdsh_launch(n))
            text = [
                f"pdsh {r.floor[n]['pdsh'][-1].wall:.2f}s, seq ssh {r.floor[n]['seq'][-1].wall:.2f}s, "
                f"pdsh launch {r.floor[n]['launch'][-1].wall:.2f}s"
            ]
            for tree in r.trees if i % 2 == 0 else r.trees[::-1]:  # alternate the order between rounds
                c = tfctl_cycle(bench, n, tree, args.settle)
                for k in VERBS3:
                    r.rows[tree][n][k].append(c[k])
                if "watcher" in c:
                    r.watch[tree].setdefault(n, []).append(c["watcher"])
                text.append(
                    f"{r.labels[tree] + ' ' if len(r.trees) > 1 else ''}up {c['up'].wall:.2f}s, "
                    f"status {c['status'].wall:.2f}s, down {c['down'].wall:.2f}s"
                )
            say(f"  N={n} round {i + 1}: " + "; ".join(text) + f" (load {os.getloadavg()[0]:.2f})")
        if not args.no_trace:
            for tree in r.trees:
                r.traces[tree][n] = tfctl_cycle(bench, n, tree, args.settle, trace=True)["trace"]


def main() -> int:
    args = parse_args()
    sizes, trees = args.hosts, args.trees
    labels = {tree: tree_label(tree) for tree in trees}
    reason = skip_reason()
    if reason:
        print(f"cannot create the host lab here: {reason}", file=sys.stderr)
        return 2
    for tool in ("pdsh", "ssh"):
        if shutil.which(tool) is None:
            print(f"`{tool}` not found", file=sys.stderr)
            return 2

    def say(text: str = "") -> None:
        print(text, flush=True)

    work = Path(tempfile.mkdtemp(prefix="tfctl-bench-"))
    t_begin = time.monotonic()
    ssh_version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    say("# tfctl fan-out benchmark")
    say(
        f"\n{os.cpu_count()} CPUs; load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"python {sys.version.split()[0]} ({sys.executable}); {ssh_version}"
    )
    for tree in trees:
        say(f"tfctl {'under test' if tree == SRC else 'compared'}: {labels[tree]} ({tree})")
    say(
        f"sizes {sizes}, {args.repeat} timed repetitions (median reported), {args.warmup} warm-up round(s) per "
        f"size, {args.settle:g}s between `up -d` and `status`"
    )
    r = Results(
        trees,
        labels,
        sizes,
        args.repeat,
        args.warmup,
        args.settle,
        rows={t: {} for t in trees},
        cold={t: {} for t in trees},
        watch={t: {} for t in trees},
        traces={t: {} for t in trees},
    )
    ok = True
    try:
        with make_lab(sizes[-1], work) as lab:
            say(
                f"lab: {sizes[-1]} hosts {lab.hosts[0].name}..{lab.hosts[-1].name} on {SUBNET}.0/24 "
                f"(created in {lab.timings['create']:.2f}s)"
            )
            bench = Bench(lab, work, SRC)
            bench.reuse_homes = args.reuse_home
            measure(bench, args, r, say)
            report(r, [h.name for h in lab.hosts], say)
            if not args.no_micro:
                micro(bench, sizes[-1], max(3, args.repeat), say)
            left = bench.leftovers()
            if left:
                ok = False
                say(f"\nLEFT RUNNING on lab hosts: {left}")
            else:
                say(f"\nclean: no process with TFCTL_RUN_ID on any of the {len(lab.hosts)} lab hosts")
    except BenchError as e:
        ok = False
        say(f"\nBENCH FAILED: {e}")
    finally:
        if args.keep:
            say(f"workdir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    say(
        f"lab removed; load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"benchmark took {time.monotonic() - t_begin:.0f}s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
