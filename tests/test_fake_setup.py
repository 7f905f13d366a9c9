"""What `up` does between preflight and the first task, on the fake backend in this process:
the workdir synced to hosts that do not share this machine's files (only what changed, once per
shared home), and `setup:` run once per workdir with its commands and output shown, its failure
stopping everything before any task starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fake_runs import FAKE_FILE, end, write
from tests.fakes import TaskScript
from tfctl.cluster.cluster import Cluster
from tfctl.config.loader import load_config
from tfctl.controller.live import launch as live_launch
from tfctl.controller.start.plan import remote_workdir
from tfctl.controller.verbs import up
from tfctl.errors import HostError, StartupError, TfctlError
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState, TaskState

SETUP = "setup: [pip install -r requirements.txt, python prepare.py]\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A workdir: the cluster file, code, and data that `exclude` keeps from the hosts."""
    tmp_path = tmp_path / "project"  # beside the run store, not holding it
    tmp_path.mkdir()
    (tmp_path / "train.py").write_text("print('training')\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"\0" * 1000)
    return tmp_path


def launch(path: Path) -> tuple[RunStore, Cluster, list[tuple[str, str]]]:
    said: list[tuple[str, str]] = []
    store = RunStore()
    plan = up.acquire(store, load_config(path), lambda *_: None)
    cluster = live_launch.launch(store, plan, lambda who, what: said.append((who, what)), detach=True)
    return store, cluster, said


def test_a_remote_host_gets_the_workdir_synced_and_later_runs_send_only_what_changed(project, fake_backend):
    path = write(project, FAKE_FILE.replace("fake: {pool: gpus}", "fake: {pool: gpus, remote: [h2]}"))
    path.write_text(path.read_text() + "exclude: [data]\n")
    store, cluster, said = launch(path)
    with cluster:
        run_id = cluster.record.run_id
        dest = remote_workdir(run_id)
        assert ("h2", f"syncing {project} (3 files)") in said
        assert ("h2", f"synced: 3 of 3 files changed, now in {dest}") in said
        tree = fake_backend.hosts["h2"].trees[dest]
        assert (
            sorted(tree) == ["cluster.yaml", "requirements.txt", "train.py"]
            and tree["train.py"] == b"print('training')\n"
        )
        assert "sync_plan" not in fake_backend.journal.verbs("h1")  # h1 sees this machine's files
        cwd = {name: launched.cwd for name, launched in fake_backend.hosts["h2"].launches.items()}
        assert cwd == {"worker:1": dest} and fake_backend.hosts["h1"].launches["worker:0"].cwd == str(project)
        assert fake_backend.journal.index("sync_apply") < fake_backend.journal.index("start")
        cluster.stop()
        end(store, run_id, RunState.STOPPED, "test over")

    (project / "train.py").write_text("print('training harder')\n")
    store, cluster, said = launch(path)
    with cluster:
        assert ("h2", f"synced: 1 of 3 files changed, now in {remote_workdir(cluster.record.run_id)}") in said
        cluster.stop()


def test_hosts_that_share_a_home_get_one_copy(project, fake_backend):
    path = write(project, FAKE_FILE.replace("fake: {pool: gpus}", "fake: {pool: gpus, remote: [h1, h2]}"))
    fake_backend.agent("h1").filesystem = fake_backend.agent("h2").filesystem = "nfs-home"
    _store, cluster, said = launch(path)
    with cluster:
        assert ("h2", "shares its home directory with h1: the same copy, synced once") in said
        assert (
            fake_backend.journal.verbs().count("sync_apply") == 1
            and fake_backend.journal.verbs().count("sync_plan") == 2
        )
        cluster.stop()


def test_a_host_that_cannot_sync_fails_the_start_before_any_task(project, fake_backend):
    path = write(project, FAKE_FILE.replace("fake: {pool: gpus}", "fake: {pool: gpus, remote: [h2]}"))
    fake_backend.agent("h2").fail_verbs["sync_plan"] = HostError("h2", "No space left on device")
    with pytest.raises(TfctlError, match="h2: No space left on device"):
        launch(path)
    (record,) = RunStore().all()
    assert (record.state, record.reason) == (RunState.FAILED, "h2: No space left on device")
    assert "start" not in fake_backend.journal.verbs() and fake_backend.released == [record.run_id]


def test_setup_runs_once_per_host_before_any_task_showing_each_command_and_its_output(project, fake_backend):
    fake_backend.scripts["setup:0"] = TaskScript(end_after=0, lines=["Requirement already satisfied: numpy"])
    fake_backend.scripts["setup:1"] = TaskScript(end_after=0, lines=["Successfully installed numpy-2.1"])
    store, cluster, said = launch(write(project, FAKE_FILE + SETUP))
    with cluster:
        h1 = [what for who, what in said if who == "h1"]
        assert h1[h1.index(f"setup: 2 commands in {project}") :][:5] == [
            f"setup: 2 commands in {project}",
            "$ pip install -r requirements.txt",
            "$ python prepare.py",
            "Requirement already satisfied: numpy",
            "setup done",
        ]
        assert ("h2", "Successfully installed numpy-2.1") in said and ("h2", "setup done") in said
        journal = fake_backend.journal
        assert journal.index("start", "setup:0") < journal.index("start", "ps:0")
        setup = fake_backend.hosts["h1"].launches["setup:0"]
        assert "eval 'pip install -r requirements.txt' || exit $?" in setup.command and setup.cwd == str(project)
        assert store.load(cluster.record.run_id).state is RunState.RUNNING
        cluster.stop()


def test_hosts_sharing_a_workdir_set_it_up_once(project, fake_backend):
    fake_backend.agent("h1").filesystem = fake_backend.agent("h2").filesystem = "nfs-home"
    fake_backend.scripts["setup:0"] = TaskScript(end_after=0)
    _store, cluster, said = launch(write(project, FAKE_FILE + SETUP))
    with cluster:
        assert ("h2", "shares its workdir with h1: set up there, once") in said
        assert "setup:1" not in fake_backend.hosts["h2"].launches
        cluster.stop()


def test_a_failed_setup_names_the_host_the_command_and_its_last_lines_and_starts_no_task(project, fake_backend):
    fake_backend.scripts["setup:0"] = TaskScript(end_after=0)
    fake_backend.scripts["setup:1"] = TaskScript(
        end_after=0, exit_code=1, lines=["Collecting tensorflw", "ERROR: No matching distribution found for tensorflw"]
    )
    with pytest.raises(StartupError) as caught:
        launch(write(project, FAKE_FILE + SETUP))
    assert caught.value.message == (
        "setup failed on h2: `python prepare.py` exited with code 1\n"
        "  last 2 lines:\n"
        "    Collecting tensorflw\n"
        "    ERROR: No matching distribution found for tensorflw"
    )
    assert caught.value.hint == "fix the command or the host, then `tfctl up` again; no task was started"
    (record,) = RunStore().all()
    assert (record.state, record.reason) == (
        RunState.FAILED,
        "setup failed on h2: `python prepare.py` exited with code 1",
    )
    assert "ps:0" not in fake_backend.hosts["h1"].launches
    assert fake_backend.journal.verbs("h1")[-1] == "stop"  # what was started is stopped


def test_setups_failing_on_several_hosts_are_reported_together(project, fake_backend):
    fake_backend.scripts["setup:0"] = TaskScript(end_after=0, signal=9)
    fake_backend.scripts["setup:1"] = TaskScript(end_after=0, exit_code=2)
    with pytest.raises(StartupError) as caught:
        launch(write(project, FAKE_FILE + "setup: [make]\n"))
    assert caught.value.message.splitlines() == [
        "setup failed on 2 hosts:",
        "h1: `make` was killed by signal 9 (SIGKILL, maybe by the kernel's out-of-memory killer) (no output)",
        "h2: `make` exited with code 2 (no output)",
    ]
    assert fake_backend.hosts["h2"].tasks["setup:1"].state is TaskState.FAILED


def test_a_failed_setup_with_one_line_of_output_says_last_line_not_last_1_lines(project, fake_backend):
    fake_backend.scripts["setup:0"] = TaskScript(end_after=0)
    fake_backend.scripts["setup:1"] = TaskScript(end_after=0, exit_code=1, lines=["make: *** No rule"])
    with pytest.raises(StartupError) as caught:
        launch(write(project, FAKE_FILE + "setup: [make]\n"))
    assert caught.value.message == "setup failed on h2: `make` exited with code 1\n  last line:\n    make: *** No rule"
