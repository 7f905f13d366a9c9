"""`tfctl exec`, `tfctl ssh` and `tfctl tensorboard` on simulated SSH hosts (real sshd in network
namespaces, bench/netns_hosts.py), against a run that has ended: the record still knows each
task's host, directory and environment, and the synced workdir stays on the hosts.

The lab has its own prefix, bridge and subnet, so it runs beside the other modules' labs.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.netns_hosts import make_lab_fixture
from bench.waiting import wait_until
from tests.conftest import free_ports, port_listening, tfctl
from tests.test_reach import NO_TENSORBOARD, Terminal, fed, fetch, find_tensorboard_python, start_tensorboard
from tests.test_ssh_cluster import PORT, no_leftovers, write_cluster
from tfctl.supervisor.procfs import proc_cmdline

__all__ = ["no_leftovers"]  # a fixture: imported to be used here
pytestmark = pytest.mark.netns
lab = make_lab_fixture(2, scope="module", prefix="tfctl-r", bridge="tfctlbr6", subnet="10.77.6")
JOBS = f"  ps: [tfh0:{PORT}]\n  worker: [tfh1:{PORT}]"
WEIRD = 'a b\'c $(touch pwned) `id` "q"'


@dataclass(frozen=True)
class Run:
    cluster: Path
    home: Path
    run_id: str
    tensorboard: str | None  # the python of tfh1, when one with tensorboard was found

    def tfctl(self, *args: str) -> object:
        return tfctl("-f", str(self.cluster), *args, home=self.home)


@pytest.fixture(scope="module")
def finished(lab, tmp_path_factory) -> Run:
    """ps:0 on tfh0 and worker:0 on tfh1, run to their end; tfh1 runs the tensorboard python if any."""
    tmp = tmp_path_factory.mktemp("reach-run")
    board = find_tensorboard_python()
    extra = f"logdir: logs/{{run_id}}\nenv:\n  WEIRD: {json.dumps(WEIRD)}\n"
    if board:
        extra += f"hosts:\n  tfh1: {{python: {board}}}\n"
    command = (
        "{python} fake_task.py --name {job_name}{task_index} --port 2222 "
        "--sleep $( [ {job_name} = ps ] && echo -1 || echo 1 )"
    )
    cluster = write_cluster(tmp, lab, JOBS, command, extra=extra, name="reach")
    home = tmp / "tfctl-home"
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    return Run(cluster, home, run_id, board)


def synced_dir(lab, host: str, run_id: str) -> str:
    return f"{lab.host(host).home}/.tfctl/work/{run_id}"


def test_exec_runs_on_the_tasks_host_in_its_directory_with_its_environment(finished, lab, no_leftovers):
    script = 'hostname; pwd; ls; echo "$TF_CONFIG"; echo "$WEIRD"; echo oops >&2; exit 3'
    done = finished.tfctl("exec", "worker:0", "--", "sh", "-c", script)
    assert done.returncode == 3, done.stderr
    tf_config = {
        "cluster": {"ps": [f"tfh0:{PORT}"], "worker": [f"tfh1:{PORT}"]},
        "task": {"type": "worker", "index": 0},
    }
    assert done.stdout.splitlines() == [
        "tfh1",
        synced_dir(lab, "tfh1", finished.run_id),
        "fake_task.py",
        json.dumps(tf_config, separators=(",", ":")),
        WEIRD,
    ]
    assert done.stderr == "oops\n"
    assert finished.tfctl("exec", "ps", "exit", "4").returncode == 4
    args = ["-f", str(finished.cluster), "exec", "worker:0", "--", "sh", "-c", "cat; hostname"]
    copied = fed(args, finished.home, "piped\n")
    assert (copied.returncode, copied.stdout) == (0, "piped\ntfh1\n")
    typed = fed(["-f", str(finished.cluster), "ssh", "worker:0"], finished.home, "hostname\nexit 6\n")
    assert (typed.returncode, typed.stdout) == (6, "tfh1\n")


def test_ssh_gives_a_terminal_sized_like_ours_and_passes_the_shells_exit_code(finished, lab, no_leftovers):
    tfh1 = lab.host("tfh1")
    before = set(tfh1.pids())
    with Terminal(["-f", str(finished.cluster), "ssh", "worker"], finished.home, rows=30, cols=100) as term:
        term.prompt()
        term.send("stty size\n")
        term.expect(r"\r30 100\r\n")
        term.prompt()
        term.resize(40, 120)  # SIGWINCH to tfctl, which tells the remote terminal
        # Deliberately 1 s for that to arrive: only a command run there could see the new size,
        # and each try would add to the output this test reads.
        time.sleep(1)
        term.send("stty size\n")
        term.expect(r"\r40 120\r\n")
        term.prompt()
        term.send('echo "cwd=$(pwd)"; echo "tf=$TF_CONFIG"; exit 5\n')
        assert term.finish() == 5
    assert f"cwd={synced_dir(lab, 'tfh1', finished.run_id)}\n" in term.text()
    assert '"task":{"type":"worker","index":0}}\n' in term.text()
    wait_until(lambda: set(tfh1.pids()) <= before, 10, "the remote shell and its session ending")


def test_tensorboard_on_the_chiefs_host_answers_through_the_forwarded_port_and_is_gone_after_ctrl_c(
    finished, lab, no_leftovers
):
    if finished.tensorboard is None:
        pytest.skip(NO_TENSORBOARD)
    tfh1 = lab.host("tfh1")
    events = f"logs/{finished.run_id}/worker_0/events.out.tfevents.1.tfh1"  # the fake task writes none
    made = finished.tfctl("exec", "worker:0", "--", "sh", "-c", 'mkdir -p "${0%/*}" && : > "$0"', events)
    assert made.returncode == 0, made.stderr
    (port,) = free_ports(1)
    board = start_tensorboard(["-f", str(finished.cluster), "tensorboard", "--port", str(port)], finished.home)
    try:
        assert board.url(timeout=120) == f"http://127.0.0.1:{port}/"
        assert fetch(f"http://127.0.0.1:{port}/") == 200
        assert [p for p in tfh1.pids() if "tensorboard" in proc_cmdline(p)] != []
        board.proc.send_signal(signal.SIGINT)
        rest = board.finish(timeout=60)
    finally:
        board.kill()
    assert board.proc.returncode == 0, rest
    assert f"TensorBoard for run {finished.run_id} on tfh1 (the host of worker:0; pid " in rest
    assert "Ctrl-C: TensorBoard stopped on tfh1 (" in rest and "; 0 remain; its port is closed)" in rest, rest
    assert [p for p in tfh1.pids() if "tensorboard" in proc_cmdline(p)] == []
    assert not port_listening(port)


def test_a_host_that_cannot_be_reached_is_named(finished, lab, no_leftovers):
    lab.host("tfh1").set_link(False)
    try:
        done = finished.tfctl("exec", "worker:0", "--", "true")
    finally:
        lab.host("tfh1").set_link(True)
    assert done.returncode == 1
    assert done.stderr.startswith("error: tfh1: cannot reach tfh1"), done.stderr
