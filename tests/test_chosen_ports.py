"""Tasks written without a port: their hosts pick free ones at `up`, hold them until the tasks
start, and TF_CONFIG, the classic flags, the record and `status` name them.

The host side runs for real here (listeners in this machine's network); the controller's
decisions run on the fake backend (tests/fakes.py picks ports from 20000 up).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

import pytest

from tests.fake_runs import started, tfctl_here, write
from tests.fakes import TaskScript
from tfctl.config.loader import parse_config
from tfctl.errors import HostError
from tfctl.supervisor import ports, procfs, tasks
from tfctl.supervisor.errors import AgentError
from tfctl.supervisor.protocol import PickPortsRequest, StopRequest
from tfctl.tf.tasks import plan_tasks

NO_PORTS = """\
name: fake
backend: fake
fake: {pool: gpus}
command: train --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} --worker_hosts={worker_hosts}
jobs:
  ps: [h1]
  worker: [h1, h1:2223, h2]
"""


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def kill(pid: int) -> None:
    """The holder by its pid, if a failed assertion left it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)


def free_span(length: int) -> int:
    """The first of `length` consecutive ports nothing here holds, below the ephemeral range."""
    low, high = ports.candidates(ports.ephemeral_range())[0]
    for first in range(low + 5000, high - length, length):
        if all(bindable(p) for p in range(first, first + length)):
            return first
    pytest.skip("no free span of ports")


def test_a_host_picks_free_ports_outside_its_ephemeral_range_and_holds_them_until_the_runs_stop(tmp_path):
    root, run_id = str(tmp_path / "root"), "chosen-20261127-000000-abcd"
    answer = ports.pick_ports(root, PickPortsRequest(run_id, 3, avoid=[2222], seconds=60))
    try:
        low, high = ports.ephemeral_range()
        assert len(set(answer.ports)) == 3 and not any(low <= p <= high for p in answer.ports)
        assert not any(bindable(p) for p in answer.ports)  # held: nothing else can take them
        assert procfs.proc_env_markers(answer.pid)[0] == run_id  # so `down` finds it as one of the run's
        assert tasks.stop(root, StopRequest(run_id, 1.0, tasks=[])).processes == 1  # stops only the holder
        assert all(bindable(p) for p in answer.ports)
    finally:
        kill(answer.pid)


def test_picked_ports_avoid_the_ones_asked_and_too_few_free_ports_say_so(tmp_path, monkeypatch):
    first = free_span(3)
    monkeypatch.setattr(ports, "candidates", lambda _ephemeral: [(first, first + 2)])
    root, run_id = str(tmp_path / "root"), "chosen-20261127-000000-beef"
    answer = ports.pick_ports(root, PickPortsRequest(run_id, 2, avoid=[first + 1], seconds=60))
    try:
        assert sorted(answer.ports) == [first, first + 2]
        with pytest.raises(AgentError, match=f"only 0 of 1 ports in {first}-{first + 2} are free"):
            ports.pick_ports(root, PickPortsRequest(run_id, 1, avoid=[first + 1], seconds=60))
    finally:
        tasks.stop(root, StopRequest(run_id, 1.0, tasks=[]))
        kill(answer.pid)


@pytest.mark.parametrize("ephemeral", [(32768, 60999), (10500, 65000), (1024, 64900), (5000, 9000), (11000, 60999)])
def test_ports_are_never_picked_inside_the_ephemeral_range_however_little_room_it_leaves(ephemeral):
    spans = ports.candidates(ephemeral)
    picked = {p for low, high in spans for p in range(low, high + 1)}
    assert picked and min(picked) >= 1024 and not any(ephemeral[0] <= p <= ephemeral[1] for p in picked)


def test_an_ephemeral_range_of_every_port_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(AgentError, match="outside the ephemeral range 1024-65535 .*: it leaves no port above 1024"):
        ports.pick_ports(str(tmp_path), PickPortsRequest("chosen-20261127-000000-cafe", 1, seconds=60))


def test_chosen_ports_fill_tf_config_and_the_classic_flags():
    config = parse_config(NO_PORTS.replace("backend: fake\nfake: {pool: gpus}\n", ""), Path("cluster.yaml"))
    filled = config.with_ports({"h1": [20001, 20002], "h2": [20001]})
    planned = plan_tasks(filled, "r1", {"h1": "python", "h2": "python"}, {"h1": "/w", "h2": "/w"})
    by_name = {t.name: t for t in planned}
    assert [t.address for t in planned] == ["h1:20001", "h1:20002", "h1:2223", "h2:20001"]
    assert json.loads(by_name["worker:2"].env["TF_CONFIG"])["cluster"] == {
        "ps": ["h1:20001"],
        "worker": ["h1:20002", "h1:2223", "h2:20001"],
    }
    assert "--ps_hosts=h1:20001 --worker_hosts=h1:20002,h1:2223,h2:20001" in by_name["ps:0"].command


@pytest.fixture
def lab(fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, NO_PORTS)
    fake_backend.scripts.update({"ps:0": TaskScript(), "worker:0": TaskScript(), "worker:1": TaskScript()})
    return fake_backend


def test_up_dry_run_says_the_ports_are_chosen_at_start(lab):
    ran = tfctl_here("up", "--dry-run")
    assert ran.code == 0, ran.err
    assert "ps:0  h1:<chosen at start>" in ran.out.splitlines() and "worker:1  h1:2223" in ran.out.splitlines()
    assert not lab.journal.entries


def test_up_picks_ports_on_each_host_holds_them_until_the_tasks_start_and_status_shows_them(lab, tmp_path):
    store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    record = store.load(cluster.record.run_id)
    assert [t.address for t in record.tasks] == ["h1:20000", "h1:20001", "h1:2223", "h2:20000"]
    launched = lab.hosts["h2"].launches["worker:2"]
    assert json.loads(launched.env["TF_CONFIG"])["cluster"]["ps"] == ["h1:20000"]
    for host in ("h1", "h2"):
        verbs = lab.journal.verbs(host)
        # picked after preflight, freed (the run's stop with no task named) just before the start
        assert verbs.index("info") < verbs.index("pick_ports") < verbs.index("stop") < verbs.index("start")
        assert lab.hosts[host].held == []
    h1 = [d for h, v, d in lab.journal.entries if h == "h1" and v == "pick_ports"]
    assert h1 and record.task("worker:1").port == 2223  # a written port is kept, and avoided
    rows = {line.split()[0]: line.split()[1] for line in tfctl_here("status").out.splitlines()[2:6]}
    assert rows == {"ps:0": "h1:20000", "worker:0": "h1:20001", "worker:1": "h1:2223", "worker:2": "h2:20000"}
    assert tfctl_here("down").code == 0


def test_a_start_that_fails_after_picking_frees_the_picked_ports(lab, tmp_path):
    lab.agent("h1").fail_verbs["ports"] = HostError("h1", "connection reset")  # the busy check, after the pick
    with pytest.raises(HostError):
        started(tmp_path / "cluster.yaml")
    assert "pick_ports" in lab.journal.verbs("h2") and "start" not in lab.journal.verbs("h2")
    assert lab.hosts["h1"].held == [] and lab.hosts["h2"].held == []


def test_check_probes_the_ports_the_hosts_pick_and_lets_them_go(lab):
    ran = tfctl_here("check")
    assert ran.code == 0, ran.err
    assert ran.err.endswith("reachability: 2 hosts -> h1:20000: all 2 connections ok\n")
    verbs = lab.journal.verbs("h1")
    assert verbs.index("pick_ports") < verbs.index("probe") < verbs.index("stop") and "start" not in verbs
    assert lab.hosts["h1"].held == []
