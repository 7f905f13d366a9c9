"""Claims on a host's GPUs, cores and task slots: exclusive across processes and users, freed
with the last process that holds them, visible to every user and takeable by none but their own."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import REPO
from tfctl.cluster.agent import HostAgent
from tfctl.supervisor import claims
from tfctl.supervisor.errors import AgentError
from tfctl.supervisor.protocol import ClaimAsk, HoldingsRequest, StartRequest, StatusRequest, TaskLaunch, TaskState
from tfctl.transport.local import LocalTransport

# Takes the claims its arguments name, says so, and holds them until its stdin closes; with
# `wait`, first reads one line (a start signal shared by every claimant of a round).
CLAIMANT = """
import json, sys
from tfctl.supervisor import claims
from tfctl.supervisor.protocol import ClaimAsk
ask = ClaimAsk.from_wire(json.loads(sys.argv[1]))
if sys.argv[3] == "wait":
    print("ready", flush=True)
    sys.stdin.readline()
try:
    held = claims.take(ask, sys.argv[2], "worker:0")
except claims.ClaimTaken as e:
    print("taken: %s" % e, flush=True)
else:
    print("held " + " ".join(held.resources), flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A claims folder as every user's tfctl makes it (mode 1777), where other users reach it."""
    path = Path(tempfile.mkdtemp(prefix="tfctl-claims-test-", dir="/tmp")) / "claims"
    path.parent.chmod(0o755)  # as /var/tmp is: every user passes through it
    monkeypatch.setenv(claims.CLAIMS_ENV, str(path))
    yield path
    shutil.rmtree(path.parent)


class Claimant:
    """A process holding claims (as a task's monitor does), as some user."""

    def __init__(self, ask: ClaimAsk, run_id: str, user: int | None = None, wait: bool = False) -> None:
        import json

        become = [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
        argv = [*become, sys.executable, "-c", CLAIMANT, json.dumps(ask.to_wire()), run_id, "wait" if wait else "-"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None and self.process.stdin is not None
        self.out, self.stdin = self.process.stdout, self.process.stdin
        self.said = "" if wait else self.out.readline().strip()

    def end(self) -> None:
        self.stdin.close()
        self.process.wait(10)
        self.out.close()


def test_a_claim_is_exclusive_and_freed_when_its_holder_dies(shared: Path) -> None:
    first = Claimant(ClaimAsk(gpus=[1, 0]), "r1")
    assert first.said == "held gpu-0 gpu-1"
    second = Claimant(ClaimAsk(gpus=[1]), "r2")
    assert second.said == f"taken: GPU 1 is held by run r1 (task worker:0) of user {pwd.getpwuid(os.getuid()).pw_name}"
    second.end()
    assert [(h.resource, h.run_id, h.pid) for h in claims.holdings()] == [
        ("gpu-0", "r1", first.process.pid),
        ("gpu-1", "r1", first.process.pid),
    ]
    first.process.send_signal(signal.SIGKILL)
    first.end()
    assert claims.holdings() == []
    third = Claimant(ClaimAsk(gpus=[1]), "r3")
    assert third.said == "held gpu-1"
    third.end()


def test_cores_and_task_slots_are_counted_and_a_failed_claim_takes_nothing(shared: Path) -> None:
    first = Claimant(ClaimAsk(cpus=3, cpu_limit=4, task_limit=2), "r1")
    assert first.said == "held cpu-0 cpu-1 cpu-2 task-0"
    second = Claimant(ClaimAsk(gpus=[0], cpus=2, cpu_limit=4, task_limit=2), "r2")
    assert second.said == "taken: 3 of its 4 cores are held by other runs"
    second.end()
    assert {h.resource for h in claims.holdings()} == {"cpu-0", "cpu-1", "cpu-2", "task-0"}  # not gpu-0
    third = Claimant(ClaimAsk(cpus=1, cpu_limit=4, task_limit=2), "r3")
    assert third.said == "held cpu-3 task-1"
    fourth = Claimant(ClaimAsk(task_limit=2), "r4")
    assert fourth.said == "taken: 2 of its 2 task slots are held by other runs"
    for claimant in (first, third, fourth):
        claimant.end()


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_a_claims_folder_others_could_tamper_with_is_refused_with_the_fix(shared: Path, mode: int) -> None:
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(AgentError, match=r"is not a folder of mode 1777.*fix: `sudo install -d -m 1777 "):
        claims.folder()


def test_a_symlink_is_not_taken_for_the_claims_folder(shared: Path) -> None:
    (shared.parent / "elsewhere").mkdir(mode=0o1777)
    shared.symlink_to(shared.parent / "elsewhere")
    with pytest.raises(AgentError, match="is not a folder of mode 1777"):
        claims.folder()


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root (two users)")
ANN, BOB = 64101, 64102  # two users of their own, no passwd entry needed


@ROOT_ONLY
def test_two_users_claiming_in_the_same_instant_never_both_hold_a_gpu(shared: Path) -> None:
    claims.folder()  # made by root: 1777, as an admin's `install -d -m 1777` makes it
    for round_ in range(20):
        both = [
            Claimant(ClaimAsk(gpus=[0, 1]), f"{who}{round_}", uid, wait=True) for who, uid in (("a", ANN), ("b", BOB))
        ]
        for c in both:
            assert c.out.readline().strip() == "ready"
        for c in both:
            c.stdin.write("go\n")
            c.stdin.flush()
        said = [c.out.readline().strip() for c in both]
        held = [s for s in said if s.startswith("held")]
        assert len(held) == 1, said
        assert {h.resource for h in claims.holdings()} == {"gpu-0", "gpu-1"}
        for c in both:
            c.end()
    assert claims.holdings() == []


@ROOT_ONLY
def test_a_user_sees_another_user_s_claims_but_cannot_free_them(shared: Path) -> None:
    claims.folder()
    ann = Claimant(ClaimAsk(gpus=[0]), "ann-run", ANN)
    assert ann.said == "held gpu-0"
    free = "import os, sys\ntry:\n    os.unlink(sys.argv[1])\nexcept PermissionError:\n    print('refused')\n"
    for name in ("gpu-0", f"note.{ANN}.{ann.process.pid}"):
        assert (shared / name).exists()
        done = subprocess.run(
            ["setpriv", f"--reuid={BOB}", f"--regid={BOB}", "--clear-groups", sys.executable, "-c", free]
            + [str(shared / name)],
            capture_output=True,
            text=True,
        )
        assert done.stdout.strip() == "refused", done
    bob = Claimant(ClaimAsk(gpus=[0]), "bob-run", BOB)
    assert bob.said == f"taken: GPU 0 is held by run ann-run (task worker:0) of user {ANN}"
    bob.end()
    ann.end()


def test_a_task_holds_its_claims_beyond_its_monitor(shared: Path, tmp_path: Path) -> None:
    """The monitor takes the claims and hands them to its task: SIGKILL the monitor and the GPU
    stays held while the task runs; it is free once the task is gone too."""
    sleep = f"{sys.executable} -c 'import time; time.sleep(60)'"
    with HostAgent(LocalTransport(), None, str(tmp_path / "host")) as agent:
        ask = ClaimAsk(gpus=[0], cpus=1, cpu_limit=1)
        agent.call(StartRequest("r1", [TaskLaunch("worker:0", sleep, grace=1.0, claims=ask)]))
        info = agent.call(StatusRequest("r1", {"worker:0": 0})).tasks["worker:0"]
        assert info.state is TaskState.RUNNING and info.pid
        held = agent.call(HoldingsRequest()).held
        assert [(h.resource, h.run_id, h.task, h.user) for h in held] == [
            ("cpu-0", "r1", "worker:0", "root" if os.geteuid() == 0 else held[0].user),
            ("gpu-0", "r1", "worker:0", held[0].user),
        ]
        monitor = held[0].pid
        assert monitor != info.pid
        refused = agent.call(StartRequest("r2", [TaskLaunch("worker:0", sleep, grace=1.0, claims=ask)]))
        assert refused.tasks["worker:0"].state is TaskState.FAILED
        log = (tmp_path / "host").rglob("output.log")
        assert any("could not claim its share of this host: GPU 0 is held by run r1" in p.read_text() for p in log)
        os.kill(monitor, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{monitor}").exists(), 10, "the monitor gone")
        assert {h.resource for h in agent.call(HoldingsRequest()).held} == {"cpu-0", "gpu-0"}
        os.kill(info.pid, signal.SIGKILL)
        wait_until(lambda: agent.call(HoldingsRequest()).held, 10, "the claims freed", until=lambda held: held == [])
