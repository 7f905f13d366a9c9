"""Time to the first training step: tfctl beside a bash launcher, on every template and example.

For each program (the templates, and the examples' cluster files), side by side in one run:

- `bash`: the fastest honest hand launch. A bash script starts every task at once, in the
  background, with the command and working directory tfctl would give it and the environment a
  user sets by hand (TF_CONFIG, PYTHONUNBUFFERED), each output to its own file. No checks, no
  waiting.
- `bash-env`: the same script with every variable tfctl gives a task, its gRPC reconnect backoff
  (TF_GRPC_DEFAULT_OPTIONS) too: what is left is what tfctl's own launching costs.
- `together`: `tfctl up -d` with `start_order: together`.
- `ordered`: `tfctl up -d` with `start_order: ordered` (ps first, then worker 0, then the rest).

Timed from the launch until the first task logged a training step (`first`), and until every
task that trains logged one (`all`: the chief when there is a chief job, else every worker) --
a non-chief TF1 worker that found the variables uninitialised sleeps 30 s before its first step.
Steps are recognised as `tfctl status` recognises them (tfctl/tf/progress.py). Each attempt is
then stopped (tasks killed by process group, `tfctl down`) before the next.

    python -m bench.first_step                 # every program, 3 attempts of each variant
    python -m bench.first_step --reps 2 --only between-graph-async,allreduce
    python -m bench.first_step --reps 5 --variants bash,bash-env,together
    python -m bench.first_step --reps 5 --variants bash,bash-env,together --warm-home
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tfctl.config.loader import load_config
from tfctl.controller.verbs.up import plan_run
from tfctl.runs.record import TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import Mark
from tfctl.tf.progress import ProgressReader
from tfctl.tf.tasks import GRPC_OPTIONS

REPO = Path(__file__).resolve().parent.parent

PROGRAMS = {
    "between-graph-async": "templates/between-graph-async/cluster.yaml",
    "between-graph-sync": "templates/between-graph-sync/cluster.yaml",
    "parameter-server": "templates/parameter-server/cluster.yaml",
    "multi-worker-mirrored": "templates/multi-worker-mirrored/cluster.yaml",
    "mnist": "cluster.yaml.example",
    "allreduce": "examples/allreduce/cluster.yaml",
    "async-vs-sync (async)": "examples/async-vs-sync/cluster-async.yaml",
}
LIMIT = 75.0  # seconds to wait for every training task's first step
POLL = 0.05
READER = ProgressReader()
Attempt = tuple[float | None, float | None, bool]  # seconds to the first step, to every trainer's; a wait seen
VARIANTS = ("bash", "bash-env", "together", "ordered")


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now: all bound at once to port 0, so the kernel picks distinct ones."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def prepared(name: str, work: Path) -> Path:
    """The program's cluster file, in a copy of its directory under `work`, on free ports."""
    source = REPO / PROGRAMS[name]
    if source.name == "cluster.yaml.example":  # the embedded default runs examples/mnist in place
        cluster = work / "cluster.yaml"
        text = source.read_text().replace("workdir: examples/mnist", f"workdir: {REPO / 'examples' / 'mnist'}")
    else:
        copy = work / "program"
        shutil.copytree(source.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
        cluster = copy / source.name
        text = cluster.read_text()
    old = sorted(set(re.findall(r"localhost:(\d+)", text)))
    mapping = dict(zip(old, map(str, free_ports(len(old)))))
    text = re.sub(r"localhost:(\d+)", lambda m: f"localhost:{mapping[m.group(1)]}", text)
    cluster.write_text(text)
    return cluster


def slug(name: str) -> str:
    return re.sub(r"\W+", "-", name).strip("-")


def with_order(cluster: Path, order: str) -> Path:
    path = cluster.with_name(f"{cluster.stem}-{order}.yaml")
    path.write_text(
        re.sub(r"^name: (.*)$", rf"name: \1-{order}", cluster.read_text(), flags=re.M) + f"\nstart_order: {order}\n"
    )
    return path


def trainers(tasks: list[TaskSpec]) -> list[str]:
    chief = [t.name for t in tasks if t.job == "chief"]
    return chief or [t.name for t in tasks if t.job == "worker"]


def first_steps(logs: dict[str, Path], began: float, wanted: list[str]) -> Attempt:
    """Seconds to the first step of any task and of every wanted task; whether any task logged
    TF's "Waiting for model to be ready"."""
    seen: dict[str, float] = {}
    offsets = dict.fromkeys(logs, 0)
    waited = False
    while time.monotonic() - began < LIMIT and not set(wanted) <= set(seen):
        for task, path in logs.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[task])
                    data = f.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            offsets[task] += cut
            for line in data[:cut].decode(errors="replace").splitlines():
                waited = waited or "Waiting for model to be ready" in line
                if task not in seen and READER.read([Mark(0.0, line)], 0.0, None, False).step is not None:
                    seen[task] = time.monotonic() - began
        time.sleep(POLL)
    first = min(seen.values()) if seen else None
    every = max(seen[t] for t in wanted) if set(wanted) <= set(seen) else None
    return first, every, waited


def run_bash(cluster: Path, work: Path, tfctl_env: bool) -> Attempt:
    config = load_config(cluster)
    record = plan_run(config, RunStore(work / "plan-home")).record
    logs = {t.name: work / f"bash-{t.name.replace(':', '-')}.log" for t in record.tasks}
    lines = ["#!/bin/bash"]
    for t in record.tasks:
        # What tfctl's host gives every task besides its env: the run's own directory.
        task_env = {**t.env, "TFCTL_RUN_DIR": str(work / "run-dir")}
        if not tfctl_env and GRPC_OPTIONS not in config.env_for(t.job):
            del task_env[GRPC_OPTIONS]  # tfctl's, not something a hand launch sets
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in task_env.items())
        lines.append(
            f"(cd {shlex.quote(t.cwd or '.')} && exec env {env} sh -c {shlex.quote(t.command)}) > {logs[t.name]} 2>&1 &"
        )
    lines.append("wait")
    script = work / "launch.sh"
    script.write_text("\n".join(lines) + "\n")
    began = time.monotonic()
    launcher = subprocess.Popen(["bash", str(script)], start_new_session=True)
    try:
        return first_steps(logs, began, trainers(list(record.tasks)))
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher's session: every task it started
        launcher.wait()


def run_tfctl(cluster: Path, home: Path) -> Attempt:
    env = {**os.environ, "TFCTL_HOME": str(home)}
    tfctl = [sys.executable, "-m", "tfctl", "-f", str(cluster)]
    before = set(runs_in(home))
    began = time.monotonic()
    up = subprocess.Popen([*tfctl, "up", "-d"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        run_id = wait_for_run(home, began, before)
        record = RunStore(home).load(run_id)
        task_dirs = {t.name: t.name.replace(":", "-") for t in record.tasks}
        roots = list((home / "hosts").glob(f"*/tasks/{run_id}"))
        while not roots and time.monotonic() - began < LIMIT:
            time.sleep(POLL)
            roots = list((home / "hosts").glob(f"*/tasks/{run_id}"))
        logs = {name: roots[0] / d / "output.log" for name, d in task_dirs.items()}
        return first_steps(logs, began, trainers(list(record.tasks)))
    finally:
        up.wait()
        subprocess.run([*tfctl, "down"], env=env, capture_output=True)


def runs_in(home: Path) -> list[Path]:
    return list((home / "runs").glob("*/run.json")) if (home / "runs").is_dir() else []


def wait_for_run(home: Path, began: float, before: set[Path]) -> str:
    while time.monotonic() - began < LIMIT:
        runs = [r for r in runs_in(home) if r not in before]
        if runs:
            return json.loads(runs[0].read_text())["run_id"]
        time.sleep(POLL)
    raise RuntimeError("tfctl up made no run record")


def warmed_home(cluster: Path, home: Path) -> Path:
    """A TFCTL_HOME that already holds the supervisor, as after a user's first run: `tfctl check`
    ships it (and checks the hosts) without starting anything."""
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "check"],
        env={**os.environ, "TFCTL_HOME": str(home)},
        capture_output=True,
    )
    return home


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated program names")
    p.add_argument(
        "--variants", default="bash,together,ordered", help="which of bash,bash-env,together,ordered (bash always)"
    )
    p.add_argument(
        "--warm-home",
        action="store_true",
        help="one TFCTL_HOME per program and variant, its supervisor shipped before the first attempt "
        "(a user's next run); by default every attempt gets a fresh one and pays for that",
    )
    a = p.parse_args()
    # With it, every `tfctl` of an editable install (this checkout) compiles its modules anew:
    # ~30 ms before the first task that an installed tfctl (compiled by pip) never pays.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    variants = [v for v in VARIANTS if v in a.variants.split(",")]
    if "bash" not in variants:
        p.error("--variants must include bash: every ratio is to it")
    names = [n for n in PROGRAMS if not a.only or n in a.only.split(",")]
    rows: list[tuple[str, dict[str, list[Attempt]]]] = []
    with tempfile.TemporaryDirectory(prefix="tfctl-first-step-") as tmp:
        for name in names:
            results: dict[str, list[Attempt]] = {}
            for rep in range(a.reps):
                for variant in variants:  # side by side, interleaved
                    work = Path(tmp) / f"{slug(name)}-{variant}-{rep}"
                    work.mkdir()
                    cluster = prepared(name, work)
                    if variant.startswith("bash"):
                        got = run_bash(cluster, work, tfctl_env=variant == "bash-env")
                    elif a.warm_home:
                        home = Path(tmp) / f"{slug(name)}-{variant}-home"
                        home = home if home.exists() else warmed_home(cluster, home)
                        got = run_tfctl(with_order(cluster, variant), home)
                    else:
                        got = run_tfctl(with_order(cluster, variant), work / "home")
                    results.setdefault(variant, []).append(got)
                    print(
                        f"{name:<24} {variant:<9} rep {rep}: first {fmt(got[0])} all {fmt(got[1])}"
                        f"{'  (Waiting for model)' if got[2] else ''}",
                        flush=True,
                    )
            rows.append((name, results))
    print()
    # Beside the medians, the fastest attempt of each: the launcher's own cost with the noise of
    # TF's start (and of the 2 cores it shares) taken out.
    head = ("program", "variant", "first (median)", "all (median)", "x bash first", "x bash all", "x fastest all")
    with_env = "bash-env" in variants
    print(
        f"{head[0]:<24} {head[1]:<9} {head[2]:>15} {head[3]:>13} {head[4]:>13} {head[5]:>11} {head[6]:>14}"
        f"{'  x bash-env all' if with_env else ''}  waits"
    )
    for name, results in rows:
        base = (median([r[0] for r in results["bash"]]), median([r[1] for r in results["bash"]]))
        fastest_base = fastest([r[1] for r in results["bash"]])
        env_base = median([r[1] for r in results["bash-env"]]) if with_env else None
        for variant, attempts in results.items():
            first, every = median([r[0] for r in attempts]), median([r[1] for r in attempts])
            to_env = f"{ratio(every, env_base):>16}" if with_env else ""
            print(
                f"{name:<24} {variant:<9} {fmt(first):>15} {fmt(every):>13} {ratio(first, base[0]):>13} "
                f"{ratio(every, base[1]):>11} {ratio(fastest([r[1] for r in attempts]), fastest_base):>14}"
                f"{to_env}  {sum(r[2] for r in attempts)}/{len(attempts)}"
            )
    return 0


def median(values: list[float | None]) -> float | None:
    known = [v if v is not None else LIMIT for v in values]
    return statistics.median(known) if known else None


def fastest(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


if __name__ == "__main__":
    sys.exit(main())
