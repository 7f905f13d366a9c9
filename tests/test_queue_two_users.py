"""Two real Unix users (uids of their own, made with setpriv) queueing on one pool host at once,
each with a run store of their own and nothing shared but the host's claims folder: they never
hold one GPU together, and the pool is shared between them, not first come, takes all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK
from tfctl.supervisor import claims

ANN, BOB = 64103, 64104  # users of their own, no passwd entry needed
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root (two users made with setpriv)"
)
NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-compute-apps=*|--query-gpu=index,utilization.gpu) ;;
  *) printf '0, GPU-0\\n1, GPU-1\\n' ;;
esac
"""


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder every user passes through: the pool file, the stand-in nvidia-smi, the task,
    the claims folder (1777, as an admin makes it) and each user's home (theirs alone)."""
    base = Path(tempfile.mkdtemp(prefix="tfctl-two-users-", dir="/tmp"))
    base.chmod(0o755)
    (base / "bin").mkdir()
    (base / "bin" / "nvidia-smi").write_text(NVIDIA_SMI)
    (base / "bin" / "nvidia-smi").chmod(0o755)
    shutil.copy(FAKE_TASK, base / "fake_task.py")
    (base / "fake_task.py").chmod(0o644)
    (base / "pool.yaml").write_text("hosts:\n  localhost: {gpus: 2}\n")
    monkeypatch.setenv(claims.CLAIMS_ENV, str(base / "claims"))
    claims.folder()
    for uid in (ANN, BOB):
        home = base / str(uid)
        home.mkdir(mode=0o700)
        os.chown(home, uid, uid)
    probe = as_user(base, ANN, "-c", "import tfctl")
    if probe.returncode != 0:
        shutil.rmtree(base)
        pytest.skip(f"another user cannot import this tfctl ({sys.executable}): {probe.stderr.strip()[-200:]}")
    yield base
    for uid in (ANN, BOB):  # what a failed test left: its runs stopped, its driver gone (by pid)
        for r in runs(base, uid):
            if r["state"] in ("queued", "starting", "running"):
                tfctl_as(base, uid, "cancel", r["run_id"])
        driver = Path(f"/proc/{json.loads(tfctl_as(base, uid, 'queue', '--json').stdout or '{}').get('driver')}")
        wait_until(lambda: not driver.exists(), 30, "the user's queue driver ending")  # noqa: B023 (waited here)
    shutil.rmtree(base)


def as_user(base: Path, uid: int, *args: str) -> subprocess.CompletedProcess:
    home = base / str(uid)
    env = {
        "PATH": f"{base / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
        "TFCTL_HOME": str(home / ".tfctl"),
        claims.CLAIMS_ENV: str(base / "claims"),
    }
    become = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return subprocess.run(
        [*become, sys.executable, *args], cwd=home, env=env, capture_output=True, text=True, timeout=120
    )


def tfctl_as(base: Path, uid: int, *args: str) -> subprocess.CompletedProcess:
    return as_user(base, uid, "-m", "tfctl", *args)


def cluster(base: Path, uid: int) -> None:
    command = f"{{python}} {base / 'fake_task.py'} --port -1 --lines 1 --sleep 4"
    path = base / str(uid) / "cluster.yaml"
    path.write_text(
        f"name: u{uid}\npool: {base / 'pool.yaml'}\ngrace_period: 2\ncommand: {json.dumps(command)}\n"
        "jobs:\n  worker: {count: 1, gpus: 1}\n"
    )
    os.chown(path, uid, uid)


def runs(base: Path, uid: int) -> list[dict[str, Any]]:
    return list(json.loads(tfctl_as(base, uid, "runs", "--json").stdout or "[]"))


def test_two_users_share_the_pool_fairly_and_never_hold_one_gpu_together(shared: Path) -> None:
    for uid in (ANN, BOB):
        cluster(shared, uid)
    first_held: dict[str, float] = {}
    most = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal most
        import time

        while not stop.wait(0.05):
            gpus = [h for h in claims.holdings() if h.resource.startswith("gpu-")]
            most = max(most, len(gpus))
            for h in gpus:
                if h.run_id:  # (a claim just taken, its note not yet written beside it, says no run)
                    first_held.setdefault(h.run_id, time.monotonic())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ids: dict[int, list[str]] = {ANN: [], BOB: []}
    try:
        for uid in (ANN, ANN, ANN, BOB, BOB, BOB):  # ann's three first: first come would take all
            done = tfctl_as(shared, uid, "submit", "--json")
            assert done.returncode == 0, done.stderr
            ids[uid].append(json.loads(done.stdout)["run_id"])
        for uid in (ANN, BOB):
            wait_until(
                lambda uid=uid: runs(shared, uid),  # type: ignore[misc]
                120,
                f"every run of user {uid} ending",
                until=lambda listed: len(listed) == 3 and all(r["state"] == "succeeded" for r in listed),
                interval=0.5,
            )
    finally:
        stop.set()
        sampler.join()
    assert most <= 2  # never more GPUs held than the host has, whoever holds them
    assert set(first_held) == {*ids[ANN], *ids[BOB]}
    # Bob's first run started before ann's third: when a GPU freed, the user holding less went first.
    assert first_held[ids[BOB][0]] < first_held[ids[ANN][2]], first_held
    owners = {h.user for h in claims.holdings()}
    assert owners == set()  # every claim freed


def test_two_users_submitting_in_the_same_instant_never_hold_one_gpu_and_every_run_starts_once(
    shared: Path,
) -> None:
    for uid in (ANN, BOB):
        cluster(shared, uid)
    most, stop = 0, threading.Event()

    def sample() -> None:
        nonlocal most
        while not stop.wait(0.02):
            holders = [(h.resource, h.user) for h in claims.holdings() if h.resource.startswith("gpu-")]
            most = max(most, len(holders))

    submitted: list[subprocess.CompletedProcess] = []

    def submit_three(uid: int) -> None:
        submitted.extend(tfctl_as(shared, uid, "submit") for _ in range(3))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    users = [threading.Thread(target=submit_three, args=(uid,)) for uid in (ANN, BOB)]
    try:
        for t in users:
            t.start()
        for t in users:
            t.join()
        assert [s.returncode for s in submitted] == [0] * 6, [s.stderr for s in submitted]
        for uid in (ANN, BOB):
            listed = wait_until(
                lambda uid=uid: runs(shared, uid),  # type: ignore[misc]
                120,
                f"every run of user {uid} ending",
                until=lambda rs: len(rs) == 3 and all(r["state"] not in ("queued", "starting", "running") for r in rs),
                interval=0.5,
            )
            assert [r["state"] for r in listed] == ["succeeded"] * 3, listed  # none refused its claim
            log = (shared / str(uid) / ".tfctl" / "queue" / "driver.log").read_text()
            assert all(log.count(f"run {r['run_id']}: started") == 1 for r in listed), log
    finally:
        stop.set()
        sampler.join()
    assert most <= 2
    assert claims.holdings() == []
