"""The queue on the suite's simulated SSH hosts (network namespaces with their own sshd), each
with one stand-in GPU and a claims folder of its own: queued runs spread over the pool's hosts
as GPUs free, a run whose task crashes at start is recorded failed and frees its GPU for the
next, a frozen host is left out while the other goes on, and nothing is left on any host.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, tfctl
from tfctl.supervisor import claims
from tfctl.supervisor.procfs import proc_env_markers

pytestmark = pytest.mark.netns
LIVE = ("queued", "starting", "running")
NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-compute-apps=*|--query-gpu=index,utilization.gpu) ;;
  *) echo "0, GPU-0" ;;
esac
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestHostLab, Path]]:
    require_netns()
    work = tmp_path_factory.mktemp("netns-lab-queue")
    (work / "bin").mkdir()
    (work / "claims").mkdir()  # each host makes its own folder in it, as in /var/tmp
    (work / "bin" / "nvidia-smi").write_text(NVIDIA_SMI)
    (work / "bin" / "nvidia-smi").chmod(0o755)
    with TestHostLab(
        2,
        workdir=work / "lab",
        prefix="tfctl-qs",
        bridge="tfctlbr82",
        subnet="10.77.82",
        session_env={claims.CLAIMS_ENV: f"{work}/claims/{{host}}"},
        path_prepend=[str(work / "bin"), str(Path(sys.executable).parent)],
    ) as lab:
        yield lab, work


def held(work: Path, host: str) -> list[claims.Holding]:
    """What the host holds, as its claims folder and the kernel's lock table say (the hosts
    share this machine's kernel; each has a folder of its own)."""
    os.environ[claims.CLAIMS_ENV] = str(work / "claims" / host)
    try:
        return claims.holdings() if (work / "claims" / host).is_dir() else []
    finally:
        del os.environ[claims.CLAIMS_ENV]


def write(tmp_path: Path, lab: TestHostLab, name: str, command: str) -> Path:
    hosts = "".join(f"  {h.name}: {{gpus: 1}}\n" for h in lab.hosts)
    (tmp_path / "pool.yaml").write_text(
        f"ssh:\n  config: {lab.ssh_config}\n  connect_timeout: 3\npython: {sys.executable}\nhosts:\n{hosts}"
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\npool: ./pool.yaml\nworkdir: {FAKE_TASK.parent}\nsync: false\ngrace_period: 2\n"
        f"host_timeout: 10\ncommand: {json.dumps(command)}\njobs:\n  worker: {{count: 1, gpus: 1}}\n"
    )
    return path


def submit(home: Path, file: Path) -> str:
    done = tfctl("-f", str(file), "submit", "--json", home=home)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["run_id"])


def states(home: Path, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in json.loads(tfctl("runs", "--json", home=home).stdout) if r["run_id"] in ids}


def all_ended(home: Path, ids: list[str], seconds: float = 120) -> dict[str, dict[str, Any]]:
    return wait_until(
        lambda: states(home, ids),
        seconds,
        "every run ending",
        until=lambda s: (
            len(s) == len(ids) and all(r["state"] not in ("queued", "starting", "running") for r in s.values())
        ),
        interval=0.5,
    )


def nothing_left(lab: TestHostLab) -> dict[str, list[int]]:
    """Per host, its processes that carry a tfctl run's marker."""
    found = {h.name: [p for p in h.pids() if proc_env_markers(p)[0]] for h in lab.hosts}
    return {host: pids for host, pids in found.items() if pids}


def test_queued_runs_spread_over_the_hosts_and_a_crashing_one_frees_its_gpu(
    tmp_path: Path, lab: tuple[TestHostLab, Path]
) -> None:
    hosts, work = lab
    home = tmp_path / "home"
    good = write(tmp_path, hosts, "good", f"{{python}} {FAKE_TASK.name} --port -1 --lines 1 --sleep 3")
    crash = write(tmp_path, hosts, "crash", "{python} -c 'raise SystemExit(3)'")
    most: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            for h in hosts.hosts:
                most[h.name] = max(most.get(h.name, 0), sum(x.resource.startswith("gpu-") for x in held(work, h.name)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        ids = [submit(home, good), submit(home, crash), *(submit(home, good) for _ in range(3))]
        ended = all_ended(home, ids)
    finally:
        stop.set()
        sampler.join()
    assert [ended[i]["state"] for i in ids] == ["succeeded", "failed", "succeeded", "succeeded", "succeeded"], ended
    placed = {json.loads((home / "runs" / i / "run.json").read_text())["placement"][0]["host"] for i in ids}
    assert placed == {h.name for h in hosts.hosts}  # both hosts used
    assert most == {h.name: 1 for h in hosts.hosts}  # one GPU each, never two runs on it
    assert all(held(work, h.name) == [] for h in hosts.hosts)
    wait_until(lambda: nothing_left(hosts), 20, "no task process left on any host", until=lambda left: not left)


def test_a_host_frozen_while_it_holds_claims_keeps_them_and_the_queue_goes_on_on_the_other(
    tmp_path: Path, lab: tuple[TestHostLab, Path]
) -> None:
    hosts, work = lab
    home = tmp_path / "home"
    long = write(tmp_path, hosts, "long", f"{{python}} {FAKE_TASK.name} --port -1 --lines 1 --sleep 6")
    short = write(tmp_path, hosts, "short", f"{{python}} {FAKE_TASK.name} --port -1 --lines 1 --sleep 1")
    first = submit(home, long)
    record = wait_until(
        lambda: json.loads((home / "runs" / first / "run.json").read_text()),
        30,
        "the first run placed",
        until=lambda r: r["placement"],
    )
    frozen = next(h for h in hosts.hosts if h.name == record["placement"][0]["host"])
    other = next(h for h in hosts.hosts if h is not frozen)
    wait_until(lambda: held(work, frozen.name), 30, "the first run's claim on its host")
    frozen.signal_all(signal.SIGSTOP)
    try:
        assert [h.run_id for h in held(work, frozen.name)] == [first]  # a frozen claimant keeps its claim
        ids = [submit(home, short) for _ in range(3)]
        ended = all_ended(home, ids)
        shown = tfctl("pool", str(tmp_path / "pool.yaml"), "--json", home=home)
        assert [h.run_id for h in held(work, frozen.name)] == [first]  # still held, by the same run
    finally:
        frozen.signal_all(signal.SIGCONT)
    assert {r["state"] for r in ended.values()} == {"succeeded"}, ended
    placed = {json.loads((home / "runs" / i / "run.json").read_text())["placement"][0]["host"] for i in ids}
    assert placed == {other.name}  # nothing placed on the host that did not answer
    by_host = {h["host"]: h for h in json.loads(shown.stdout)["hosts"]}
    assert by_host[frozen.name]["error"] and shown.returncode == 1, by_host
    all_ended(home, [first])  # thawed: the first run ends (its tasks' end, or its host's silence)
    wait_until(lambda: held(work, frozen.name), 30, "its claim freed", until=lambda h: h == [])
    wait_until(lambda: nothing_left(hosts), 20, "no task process left on any host", until=lambda left: not left)
