"""What a host decides alone: the lease of an attached run, and the idle rule of a ps.

The rules' logic with probes and the clock under the test's control, then the rules as monitors
apply them to real processes on this machine.
"""

from __future__ import annotations

import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, free_ports
from tfctl.cluster.agent import HostAgent
from tfctl.supervisor import guard
from tfctl.supervisor.procfs import proc_stat
from tfctl.supervisor.protocol import (
    IdleRule,
    StartRequest,
    StatusRequest,
    StopRequest,
    TaskInfo,
    TaskLaunch,
    TaskState,
)
from tfctl.transport.local import LocalTransport

# -- the idle rule's logic ----------------------------------------------------------------------


class Peers:
    """Stand-ins for the network as the rule sees it: who listens, and whether anyone is connected."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listening: dict[str, bool | None] = {}
        self.connected = False
        self.probes = 0
        monkeypatch.setattr(guard, "probe", self._probe)
        monkeypatch.setattr(guard, "connected", lambda port: self.connected)

    def _probe(self, address: str) -> bool | None:
        self.probes += 1
        return self.listening[address]


RULE = IdleRule(port=2222, timeout=100, watch={"worker:0": "w0:2222", "worker:1": "w1:2222"}, startup_timeout=300)


def run_until(watch: guard.IdleWatch, start: float, end: float) -> tuple[float, str] | None:
    """Check every second from `start` to `end`; the first time (and reason) it says stop."""
    t = start
    while t <= end:
        why = watch.check(t)
        if why:
            return t, why
        t += 1
    return None


def test_the_ps_stops_once_every_decisive_task_it_saw_is_gone_for_the_timeout(monkeypatch) -> None:
    peers = Peers(monkeypatch)
    watch = guard.IdleWatch(RULE, started=0)
    peers.listening = {"w0:2222": True, "w1:2222": True}
    assert run_until(watch, 0, 50) is None
    peers.listening = {"w0:2222": False, "w1:2222": True}  # one worker done: the job goes on
    assert run_until(watch, 51, 200) is None
    peers.listening = {"w0:2222": False, "w1:2222": False}
    stopped = run_until(watch, 201, 400)
    assert stopped is not None
    at, why = stopped
    assert 301 <= at <= 301 + watch.poll + 1
    assert "worker:0, worker:1 gone" in why and "port 2222" in why


def test_a_connected_peer_or_an_unanswered_probe_keeps_the_ps(monkeypatch) -> None:
    peers = Peers(monkeypatch)
    watch = guard.IdleWatch(RULE, started=0)
    peers.listening = {"w0:2222": True, "w1:2222": True}
    watch.check(0)
    peers.listening = {"w0:2222": False, "w1:2222": False}
    peers.connected = True  # e.g. an evaluator still reading variables
    probes = peers.probes
    assert run_until(watch, 1, 500) is None
    assert peers.probes == probes  # nothing is probed while the ps is in use
    peers.connected = False
    peers.listening = {"w0:2222": False, "w1:2222": None}  # w1's host does not answer: proves nothing
    assert run_until(watch, 501, 1000) is None
    peers.listening = {"w0:2222": False, "w1:2222": False}
    assert run_until(watch, 1001, 1200) is not None


def test_the_idle_clock_starts_again_when_a_decisive_task_comes_back(monkeypatch) -> None:
    peers = Peers(monkeypatch)
    watch = guard.IdleWatch(RULE, started=0)
    peers.listening = {"w0:2222": True, "w1:2222": True}
    watch.check(0)
    peers.listening = {"w0:2222": False, "w1:2222": False}
    assert run_until(watch, 1, 90) is None
    peers.listening = {"w0:2222": True, "w1:2222": False}  # restarted, listening again
    assert run_until(watch, 91, 100) is None
    peers.listening = {"w0:2222": False, "w1:2222": False}
    stopped = run_until(watch, 101, 400)
    assert stopped is not None and stopped[0] >= 201


def test_decisive_tasks_never_seen_listening_count_as_gone_only_after_the_startup_timeout(monkeypatch) -> None:
    peers = Peers(monkeypatch)
    watch = guard.IdleWatch(RULE, started=0)
    peers.listening = {"w0:2222": False, "w1:2222": False}  # still importing TensorFlow, say
    assert run_until(watch, 0, 299) is None
    stopped = run_until(watch, 300, 600)
    assert stopped is not None and 400 <= stopped[0] <= 400 + watch.poll + 1


def test_peers_connected_all_through_training_count_as_seen_and_the_reason_states_the_real_wait(
    monkeypatch,
) -> None:
    """The ps port is busy all through a 60 s training, so no probe ever saw the workers listen;
    they were there all the same. The ps stops one idle timeout after the job ends (not the
    start-up timeout plus the idle timeout), and says how long nothing was connected."""
    peers = Peers(monkeypatch)
    watch = guard.IdleWatch(RULE, started=0)
    peers.connected = True
    assert run_until(watch, 0, 60) is None
    peers.connected = False
    peers.listening = {"w0:2222": False, "w1:2222": False}
    stopped = run_until(watch, 61, 600)
    assert stopped is not None
    at, why = stopped
    assert 160 <= at <= 161 + watch.poll + 1, at  # not 400: the start-up timeout does not apply
    waited = int(why.rsplit("for ", 1)[1].split(" s")[0])
    assert abs(waited - (at - 60)) <= watch.poll + 1, why  # the real quiet time, since the last connection


def test_without_decisive_tasks_to_watch_nothing_is_ever_idle(monkeypatch) -> None:
    Peers(monkeypatch)
    watch = guard.IdleWatch(IdleRule(port=1, timeout=1, watch={}, startup_timeout=1), started=0)
    assert run_until(watch, 0, 100) is None


# -- the rules on real processes ----------------------------------------------------------------

PY = sys.executable


def fake(flags: str) -> str:
    return f"{shlex.quote(PY)} {FAKE_TASK} {flags}"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[HostAgent]:
    with HostAgent(LocalTransport(), None, str(tmp_path / "host")) as agent:
        yield agent


def states(agent: HostAgent, run: str, tasks: list[str], renew: bool = False) -> dict[str, TaskInfo]:
    return agent.call(StatusRequest(run, {t: 0 for t in tasks}, renew_lease=renew)).tasks


def wait_stopped(agent: HostAgent, run: str, task: str, timeout: float) -> TaskInfo:
    return wait_until(
        lambda: states(agent, run, [task])[task],
        timeout,
        f"{task} of {run} ending",
        until=lambda info: info.state.is_final,
        interval=0.1,
    )


def gone(pid: int | None) -> bool:
    st = proc_stat(pid) if pid else None
    return st is None or st["state"] in ("Z", "X")


def test_a_lease_stops_the_runs_tasks_only_when_nobody_renews_it(agent: HostAgent) -> None:
    forever = fake("--sleep -1")
    agent.call(StartRequest("orphaned", [TaskLaunch("ps:0", forever, grace=1)], lease=1.5))
    agent.call(StartRequest("renewed", [TaskLaunch("ps:0", forever, grace=1)], lease=1.5))
    agent.call(StartRequest("detached", [TaskLaunch("ps:0", forever, grace=1)]))
    try:
        began = time.monotonic()
        while time.monotonic() - began < 4:  # deliberately well past the 1.5 s lease, renewing one run's
            states(agent, "renewed", ["ps:0"], renew=True)
            time.sleep(0.3)
        orphaned = states(agent, "orphaned", ["ps:0"])["ps:0"]
        assert orphaned.state is TaskState.STOPPED and gone(orphaned.pid)
        assert orphaned.stop_reason and orphaned.stop_reason.startswith("no controller for")
        for run in ("renewed", "detached"):
            assert states(agent, run, ["ps:0"])["ps:0"].state is TaskState.RUNNING, run
    finally:
        for run in ("orphaned", "renewed", "detached"):
            agent.call(StopRequest(run, 1.0))


def test_the_ps_stops_on_its_own_once_the_worker_it_served_is_gone(agent: HostAgent) -> None:
    ps_port, worker_port = free_ports(2)
    rule = IdleRule(ps_port, timeout=1.0, watch={"worker:0": f"127.0.0.1:{worker_port}"}, startup_timeout=60)
    launches = [
        TaskLaunch("ps:0", fake(f"--port {ps_port} --sleep -1"), grace=1, idle=rule),
        TaskLaunch("worker:0", fake(f"--port {worker_port} --sleep 2"), grace=1),
    ]
    agent.call(StartRequest("job", launches))
    try:
        time.sleep(1.5)  # deliberately past the idle timeout, while the worker still works
        assert states(agent, "job", ["ps:0"])["ps:0"].state is TaskState.RUNNING
        ps = wait_stopped(agent, "job", "ps:0", timeout=10)
        assert states(agent, "job", ["worker:0"])["worker:0"].state is TaskState.SUCCEEDED
        assert ps.state is TaskState.STOPPED and gone(ps.pid)
        assert ps.stop_reason and "worker:0 gone" in ps.stop_reason
    finally:
        agent.call(StopRequest("job", 1.0))


def test_a_peer_connected_to_the_ps_keeps_it_running(agent: HostAgent) -> None:
    ps_port, worker_port = free_ports(2)
    rule = IdleRule(ps_port, timeout=1.0, watch={"worker:0": f"127.0.0.1:{worker_port}"}, startup_timeout=0.5)
    started = agent.call(StartRequest("held", [TaskLaunch("ps:0", fake(f"--port {ps_port} --sleep -1"), idle=rule)]))
    try:

        def connected() -> socket.socket | None:
            try:
                return socket.create_connection(("127.0.0.1", ps_port), timeout=1)
            except ConnectionRefusedError:
                return None

        peer = wait_until(connected, 10, "the ps listening", interval=0.1)
        assert peer is not None
        with peer:
            time.sleep(3)  # deliberately past both timeouts: the worker never listened, yet a peer uses the ps
            assert states(agent, "held", ["ps:0"])["ps:0"].state is TaskState.RUNNING
        ps = wait_stopped(agent, "held", "ps:0", timeout=10)
        assert ps.state is TaskState.STOPPED and gone(started.tasks["ps:0"].pid)
    finally:
        agent.call(StopRequest("held", 1.0))
