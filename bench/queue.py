"""The queue on a pool of simulated hosts: 200 runs submitted at once, each taking one stand-in
GPU for a few seconds, against the same runs started one `tfctl up` after another in a shell loop.

Figures, for both ways, side by side in the same run:
  submit wall    the 200 submits (8 at a time, as a script would send them); the loop has none
  free -> next   from a GPU freeing, while runs wait, to the next run's task holding a GPU
                 (median, p95): read from the hosts' own claims (their kernel's lock table),
                 sampled every 50 ms, never from tfctl's records
  CPU per run    this machine's tfctl processes (CLI, driver, watchers), summed from /proc
  pool use       GPU-seconds held / GPU-seconds the pool offered while runs waited

    python -m bench.queue                       # 16 hosts x 2 GPUs, 200 runs of 3 s
    python -m bench.queue --hosts 4 --runs 20   # a quick look
Root is needed (network namespaces with their own sshd, as the `netns` tests make them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tfctl.supervisor import claims

TICK = os.sysconf("SC_CLK_TCK")
NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-compute-apps=*|--query-gpu=index,utilization.gpu) ;;
  *) i=0; while [ $i -lt {gpus} ]; do echo "$i, GPU-$i"; i=$((i+1)); done ;;
esac
"""


@dataclass
class Held:
    """Every GPU claim seen on the hosts: (host, gpu) -> [(run, first seen, last seen)]."""

    spans: dict[tuple[str, str], list[list]] = field(default_factory=dict)

    def see(self, host: str, gpu: str, run: str, now: float) -> None:
        spans = self.spans.setdefault((host, gpu), [])
        if spans and spans[-1][0] == run and now - spans[-1][2] < 1.0:
            spans[-1][2] = now
        else:
            spans.append([run, now, now])


class Sampler:
    """The hosts' claims every 50 ms (each simulated host has a claims folder of its own, and
    all share this machine's kernel, whose /proc/locks says who holds what), and the CPU of this
    machine's tfctl processes."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self.folders = folders
        self.held = Held()
        self.cpu: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            now = time.monotonic()
            for host, folder in self.folders.items():
                os.environ[claims.CLAIMS_ENV] = str(folder)
                for h in claims.holdings():
                    if h.resource.startswith("gpu-") and h.run_id:  # ("": its note not written yet)
                        self.held.see(host, h.resource, h.run_id, now)
            self._cpu()

    def _cpu(self) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"-m\x00tfctl" not in cmdline:
                    continue
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self.cpu[int(pid)] = max(self.cpu.get(int(pid), 0.0), (int(fields[11]) + int(fields[12])) / TICK)


def figures(held: Held, runs: int, gpus: int) -> dict[str, float]:
    """free -> next (median, p95), pool use while runs waited, span of the whole queue."""
    starts = sorted(s[1] for spans in held.spans.values() for s in spans)
    ends = sorted(s[2] for spans in held.spans.values() for s in spans)
    if not starts:
        return {}
    last_start = starts[-1]
    gaps = []
    for end in ends:
        waiting = runs - sum(1 for s in starts if s <= end)
        later = [s for s in starts if s >= end]
        if waiting > 0 and later:
            gaps.append(later[0] - end)
    window = last_start - starts[0]
    used = sum(max(0.0, min(s[2], last_start) - max(s[1], starts[0])) for spans in held.spans.values() for s in spans)
    gaps.sort()
    return {
        "free_next_median": statistics.median(gaps) if gaps else float("nan"),
        "free_next_p95": gaps[int(0.95 * (len(gaps) - 1))] if gaps else float("nan"),
        "pool_use": used / (gpus * window) if window > 0 else float("nan"),
        "span": ends[-1] - starts[0],
        "seen": len(starts),
    }


def tfctl(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfctl", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
        timeout=600,
    )


def all_ended(home: Path, cwd: Path, runs: int) -> bool:
    listed = json.loads(tfctl(home, cwd, "runs", "--json").stdout or "[]")
    return len(listed) >= runs and all(r["state"] not in ("queued", "starting", "running") for r in listed)


def queue_way(work: Path, runs: int, gpus: int, folders: dict[str, Path], api: bool) -> dict[str, float]:
    """The runs submitted 8 at a time by `tfctl submit` commands, or (`api`) one after another
    by `tfctl.submit` in this process, as a sweep script would."""
    home = work / ("home-api" if api else "home-queue")
    with Sampler(folders) as sampler:
        began = time.monotonic()
        if api:
            import tfctl as api_

            for _ in range(runs):
                api_.submit(work / "cluster.yaml", home=home)
        else:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                done = list(pool.map(lambda _i: tfctl(home, work, "submit"), range(runs)))
            failed = [d.stderr for d in done if d.returncode != 0]
            if failed:
                raise SystemExit(f"{len(failed)} submits failed; the first said:\n{failed[0]}")
        submit_wall = time.monotonic() - began
        wait_until(lambda: all_ended(home, work, runs), 60 + runs * 10, "every queued run ending", interval=2)
    result = figures(sampler.held, runs, gpus)
    result.update(submit_wall=submit_wall, cpu_per_run=sum(sampler.cpu.values()) / runs)
    return result


def loop_way(work: Path, runs: int, gpus: int, folders: dict[str, Path]) -> dict[str, float]:
    home = work / "home-loop"
    script = f'for i in $(seq {runs}); do "{sys.executable}" -m tfctl up >/dev/null 2>&1 || exit 1; done'
    with Sampler(folders) as sampler:
        subprocess.run(["bash", "-c", script], cwd=work, env={**os.environ, "TFCTL_HOME": str(home)}, check=True)
    result = figures(sampler.held, runs, gpus)
    result.update(submit_wall=float("nan"), cpu_per_run=sum(sampler.cpu.values()) / runs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=2, help="stand-in GPUs per host")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--loop-runs", type=int, default=None, help="runs of the shell loop (default: --runs)")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each run holds its GPU")
    parser.add_argument("--api", action="store_true", help="submit with tfctl.submit from this process instead")
    parser.add_argument("--no-loop", action="store_true", help="measure the queue only")
    args = parser.parse_args()
    require_netns()
    work = Path(tempfile.mkdtemp(prefix="tfctl-bench-queue-"))
    (work / "bin").mkdir()
    (work / "claims").mkdir()  # each host makes its own folder in it, as in /var/tmp
    (work / "bin" / "nvidia-smi").write_text(NVIDIA_SMI.format(gpus=args.gpus))
    (work / "bin" / "nvidia-smi").chmod(0o755)
    lab = TestHostLab(
        args.hosts,
        workdir=work / "lab",
        prefix="tfctl-bq",
        bridge="tfctlbr81",
        subnet="10.77.81",
        session_env={claims.CLAIMS_ENV: f"{work}/claims/{{host}}"},
        path_prepend=[str(work / "bin"), str(Path(sys.executable).parent)],
    )
    with lab:
        folders = {h.name: work / "claims" / h.name for h in lab.hosts}
        hosts = "".join(f"  {h.name}: {{gpus: {args.gpus}}}\n" for h in lab.hosts)
        (work / "pool.yaml").write_text(f"ssh:\n  config: {lab.ssh_config}\npython: {sys.executable}\nhosts:\n{hosts}")
        command = f"{{python}} -c 'import time; time.sleep({args.seconds})'"
        (work / "cluster.yaml").write_text(
            f'name: q\npool: ./pool.yaml\nworkdir: {work}\nsync: false\ngrace_period: 2\ncommand: "{command}"\n'
            "jobs:\n  worker: {count: 1, gpus: 1}\n"
        )
        total = args.hosts * args.gpus
        queued = queue_way(work, args.runs, total, folders, args.api)
        looped = {} if args.no_loop else loop_way(work, args.loop_runs or args.runs, total, folders)
    print(f"{args.runs} runs of {args.seconds:g} s, one GPU each, on {args.hosts} hosts x {args.gpus} GPUs\n")
    print(f"{'':24}{'queue (' + ('tfctl.submit' if args.api else 'tfctl submit') + ')':>22}{'shell loop of up':>20}")
    rows = [
        ("submit wall (s)", "submit_wall", "{:.1f}"),
        ("free -> next median (s)", "free_next_median", "{:.2f}"),
        ("free -> next p95 (s)", "free_next_p95", "{:.2f}"),
        ("CPU per run (s)", "cpu_per_run", "{:.2f}"),
        ("pool use", "pool_use", "{:.0%}"),
        ("all runs done in (s)", "span", "{:.0f}"),
    ]
    for label, key, form in rows:
        mine, theirs = (form.format(way.get(key, float("nan"))) for way in (queued, looped))
        print(f"{label:24}{mine:>22}{theirs:>20}")
    seen = f"{queued.get('seen')} / {looped.get('seen')}"
    print(f"\nruns in the loop: {args.loop_runs or args.runs}; runs seen holding a GPU: {seen}")


if __name__ == "__main__":
    main()
