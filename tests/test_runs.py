"""The run store: records survive a roundtrip, writes are atomic, updates are locked.

Pure file-system logic under tmp_path; the only processes are the multiprocessing workers of the
locking tests (no TFCTL_RUN_ID marker, all joined before the test ends).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from tests.fake_runs import amend, end
from tfctl.backends.slurm.transport import SlurmStepSpec
from tfctl.config.home import tfctl_home
from tfctl.errors import EXIT_USAGE, UsageError
from tfctl.runs import transitions
from tfctl.runs.record import (
    Controller,
    ControllerKind,
    HostSpec,
    ProgressSpec,
    RestartSpec,
    RunRecord,
    TaskSpec,
)
from tfctl.runs.store import RunStore, new_run_id
from tfctl.runs.transitions import Guard, Transition
from tfctl.supervisor.protocol import RunState
from tfctl.transport.specs import LocalSpec, SSHSpec

# Not fork: this pytest process may hold TensorFlow's threads (test_tf_cluster), and forking a
# threaded process can deadlock the child. The forkserver is a fresh process that forks cheaply.
CTX = multiprocessing.get_context("forkserver")


def record(
    run_id: str = "mnist-20261122-183210-1022",
    cluster_file: str = "/srv/a/cluster.yaml",
    created_at: float = 1_795_000_000.5,
    **changes,
) -> RunRecord:
    tasks = (
        TaskSpec(
            "ps",
            0,
            "localhost",
            2222,
            "python train.py --job_name=ps",
            {"TF_CONFIG": '{"a":1}', "PYTHONUNBUFFERED": "1"},
            "/srv/a",
        ),
        TaskSpec("worker", 0, "::1", 2223, "python train.py --job_name=worker", {}, None),
        TaskSpec("worker", 1, "gpu1", 2224, "printf '%s\\n' 'ünï'", {"X": "y"}, "~/.tfctl/work/x", None, (0, 1), (3,)),
    )
    hosts = (
        HostSpec("::1", None, "/home/me/.tfctl", LocalSpec()),
        HostSpec("gpu1", "python3", "~/.tfctl", SSHSpec(user="me", port=2200)),
        HostSpec("localhost", "/venv/bin/python", "/home/me/.tfctl"),
    )
    base = RunRecord(
        run_id=run_id,
        cluster_name=run_id.split("-")[0],
        cluster_file=cluster_file,
        created_at=created_at,
        tasks=tasks,
        hosts=hosts,
        grace_period=2.5,
        decisive=("worker:0",),
        essential=("ps:0",),
    )
    return base.replace(**changes)


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "home")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- roundtrip -----------------------------------------------------------------------------------


def test_save_load_roundtrip_keeps_every_field_and_tuples(store: RunStore) -> None:
    original = record(
        state=RunState.RUNNING,
        reason="why",
        ended_at=None,
        watcher=Controller(ControllerKind.UP, 123, 456, "laptop-0123"),
    )
    store.save(original)
    loaded = store.load(original.run_id)
    assert loaded == original
    assert isinstance(loaded.tasks, tuple) and all(isinstance(t, TaskSpec) for t in loaded.tasks)
    assert isinstance(loaded.hosts, tuple) and all(isinstance(h, HostSpec) for h in loaded.hosts)
    assert isinstance(loaded.decisive, tuple) and loaded.decisive == ("worker:0",)
    assert isinstance(loaded.essential, tuple) and loaded.essential == ("ps:0",)
    assert loaded.task("worker:1").env == {"X": "y"}
    assert type(loaded.task("worker:1").gpus) is tuple and loaded.task("worker:1").gpus == (0, 1)
    assert type(loaded.task("worker:1").cpus) is tuple and loaded.task("worker:1").cpus == (3,)
    assert loaded.task("worker:0").gpus is None and loaded.task("worker:0").cpus is None
    assert loaded.task("worker:0").cwd is None
    assert loaded.task("worker:0").address == "[::1]:2223"
    hosts = {h.name: h for h in loaded.hosts}
    assert hosts["gpu1"].transport == SSHSpec(user="me", port=2200)
    assert hosts["localhost"].transport == LocalSpec()
    assert loaded.active


def test_restart_and_progress_come_back_as_typed_records(store: RunStore) -> None:
    base = record()
    restarting = base.tasks[2].replace(restart=RestartSpec("on-failure", 3, 10.0))
    original = base.replace(
        tasks=base.tasks[:2] + (restarting,), progress=ProgressSpec(r"step (?P<step>\d+)", 300.0, 30.0)
    )
    store.save(original)
    data = json.loads((store.run_dir(original.run_id) / "run.json").read_text())
    assert data["progress"] == {
        "regex": r"step (?P<step>\d+)",
        "stall_timeout": 300.0,
        "window": 30.0,
        "on_stall": "warn",
        "metrics": {},
    }
    assert data["tasks"][2]["restart"] == {"policy": "on-failure", "max_restarts": 3, "backoff": 10.0}
    loaded = store.load(original.run_id)
    assert loaded == original
    assert type(loaded.progress) is ProgressSpec and loaded.progress.stall_timeout == 300.0
    assert type(loaded.task("worker:1").restart) is RestartSpec and loaded.task("worker:0").restart is None
    assert record().progress == ProgressSpec(None, 120.0, 60.0)  # the cluster file's defaults


def test_roundtrip_of_a_finished_record(store: RunStore) -> None:
    store.create(record())
    done = end(store, record().run_id, RunState.FAILED, "worker:1 on gpu1 exited with code 3")
    assert not done.active and done.ended_at is not None and done.state is RunState.FAILED
    assert store.load(done.run_id) == done
    assert json.loads((store.run_dir(done.run_id) / "run.json").read_text())["state"] == "failed"


def test_roundtrip_of_empty_decisive_and_essential(store: RunStore) -> None:
    r = record(decisive=(), essential=())
    store.save(r)
    assert store.load(r.run_id) == r


def test_from_json_of_an_older_record_without_optional_fields() -> None:
    data = record().to_json()
    for key in ("decisive", "essential", "state", "ended_at", "reason", "watcher"):
        del data[key]
    r = RunRecord.from_json(json.loads(json.dumps(data)))
    assert (r.decisive, r.essential, r.state, r.reason) == ((), (), "starting", None)


def test_file_on_disk_is_plain_json(store: RunStore) -> None:
    r = record()
    store.save(r)
    data = json.loads((store.run_dir(r.run_id) / "run.json").read_text())
    assert data["run_id"] == r.run_id
    assert data["tasks"][0] == {
        "job": "ps",
        "index": 0,
        "host": "localhost",
        "port": 2222,
        "command": "python train.py --job_name=ps",
        "env": {"TF_CONFIG": '{"a":1}', "PYTHONUNBUFFERED": "1"},
        "cwd": "/srv/a",
        "restart": None,
        "gpus": None,
        "cpus": None,
        "container": None,
        "claims": None,
    }
    assert data["decisive"] == ["worker:0"]


# --- schema versions -----------------------------------------------------------------------------

V1_RECORD = Path(__file__).resolve().parent / "data" / "run-record-v1.json"


def test_a_record_of_version_1_is_read_forever_with_its_values_migrated(store: RunStore) -> None:
    """run-record-v1.json was written by tfctl before records said their version (at dbf4c58):
    its controller, progress settings and restart policies were dicts."""
    r = RunRecord.from_json(json.loads(V1_RECORD.read_text()))
    assert r.watcher == Controller(ControllerKind.UP, 41234, 987654, "laptop-1f2e3d4c5b6a")
    assert r.watcher.attached and type(r.watcher.kind) is ControllerKind
    assert r.progress == ProgressSpec(r"step (?P<step>\d+)", 300.0, 30.0)
    assert [t.restart for t in r.tasks] == [
        None,
        RestartSpec("on-failure", 3, 10.0),
        RestartSpec("on-failure", 3, 10.0),
    ]
    assert [(t.name, t.address, t.gpus, t.cpus) for t in r.tasks] == [
        ("ps:0", "tfh0:2222", None, None),
        ("worker:0", "tfh1:2223", (0, 1), (0, 1, 2, 3)),
        ("worker:1", "localhost:2224", (), None),
    ]
    assert r.task("ps:0").env == {"TF_CONFIG": '{"cluster":{}}'} and r.task("worker:1").cwd == "/srv/mnist"
    assert [(h.name, h.python, h.root, h.transport, h.shares_files) for h in r.hosts] == [
        ("localhost", None, "/home/me/.tfctl", LocalSpec(), True),
        ("tfh0", "python3", "~/.tfctl", SSHSpec(user="me", port=2200), False),
        ("tfh1", "/opt/venv/bin/python", "~/.tfctl", SlurmStepSpec("4711"), True),
    ]
    assert (r.run_id, r.cluster_name, r.cluster_file, r.created_at) == (
        "mnist-20250301-101500-ab12",
        "mnist",
        "/srv/mnist/cluster.yaml",
        1740823500.25,
    )
    assert (r.decisive, r.essential, r.state, r.active) == (("worker:0",), ("ps:0",), RunState.RUNNING, True)
    assert (r.grace_period, r.hang_timeout, r.startup_timeout, r.lease_timeout, r.idle_timeout, r.host_timeout) == (
        10.0,
        300.0,
        90.0,
        30.0,
        600.0,
        120.0,
    )
    assert (r.unreachable, r.store, r.ended_at, r.reason) == ({"tfh0": 1740823600.5}, "0123456789ab", None, None)
    assert (r.logdir, r.backend, r.backend_state, r.left_nothing) == (
        "logs/mnist-20250301-101500-ab12",
        "slurm",  # the backend whose transport its hosts' was: the only one that had an allocation
        {"job_id": "4711", "owned": True},
        False,
    )
    # In a store: read as it is, written back in the current version, which reads back the same.
    (store.runs_dir / r.run_id).mkdir(parents=True)
    (store.run_dir(r.run_id) / "run.json").write_bytes(V1_RECORD.read_bytes())
    assert store.load(r.run_id) == r and store.all() == [r]
    updated = amend(store, r.run_id, reason="read by a newer tfctl")
    data = json.loads((store.run_dir(r.run_id) / "run.json").read_text())
    assert data["schema_version"] == RunRecord.schema_version == 2
    assert data["watcher"] == {"kind": "up", "pid": 41234, "starttime": 987654, "host": "laptop-1f2e3d4c5b6a"}
    assert store.load(r.run_id) == updated == r.replace(reason="read by a newer tfctl")


@pytest.mark.parametrize(
    ("watcher", "controller"),
    [
        ({"pid": 7, "starttime": 8, "host": "h-1", "attached": False}, Controller(ControllerKind.WATCHER, 7, 8, "h-1")),
        ({"pid": 7, "starttime": 8}, Controller(ControllerKind.WATCHER, 7, 8, None)),  # before `host`, `attached`
        (None, None),
    ],
)
def test_a_version_1_controller_becomes_a_typed_controller(watcher, controller) -> None:
    data = json.loads(V1_RECORD.read_text())
    data["watcher"] = watcher
    assert RunRecord.from_json(data).watcher == controller


def test_the_current_version_round_trips_as_it_is(store: RunStore) -> None:
    r = record(state=RunState.RUNNING, watcher=Controller(ControllerKind.WATCHER, 5, 6, "h-1"))
    data = r.to_json()
    assert next(iter(data)) == "schema_version" and data["schema_version"] == 2
    assert data["watcher"] == {"kind": "watcher", "pid": 5, "starttime": 6, "host": "h-1"}
    assert RunRecord.from_json(json.loads(json.dumps(data))) == r
    store.save(r)
    assert store.load(r.run_id) == r


def test_a_record_of_a_newer_tfctl_is_refused_saying_so(store: RunStore) -> None:
    from tfctl.errors import TfctlError
    from tfctl.runs.record import NewerRecordError

    data = {**record().to_json(), "schema_version": 3, "something_new": {"x": 1}}
    with pytest.raises(NewerRecordError):
        RunRecord.from_json(data)
    store.save(record("m-1", created_at=1.0))
    (store.runs_dir / "m-new").mkdir()
    path = store.run_dir("m-new") / "run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TfctlError) as e:
        store.load("m-new")
    assert str(path) in e.value.message and "newer tfctl" in e.value.message and "version 3" in e.value.message
    assert e.value.hint is not None and "upgrade tfctl" in e.value.hint
    with pytest.raises(TfctlError, match="newer tfctl"):  # not skipped as damaged: its run may be live
        store.all()


@pytest.mark.parametrize("version", ["2", 0, True, None])
def test_a_record_whose_version_is_no_version_is_damaged(version) -> None:
    with pytest.raises(ValueError, match="schema_version"):
        RunRecord.from_json({**record().to_json(), "schema_version": version})


def test_save_overwrites(store: RunStore) -> None:
    store.save(record())
    store.save(record(state=RunState.SUCCEEDED, reason="done"))
    assert (store.load(record().run_id).state, store.load(record().run_id).reason) == ("succeeded", "done")


# --- all, latest ---------------------------------------------------------------------------------


def latest_id(store: RunStore, cluster_file: Path) -> str | None:
    found = store.latest(cluster_file)
    return None if found is None else found.run_id


def test_latest_is_the_newest_run_of_the_same_cluster_file_only(
    store: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a" / "cluster.yaml", tmp_path / "b" / "cluster.yaml"
    # Run ids sort against their age, so neither directory order nor the id decides.
    a_old = record("mnist-20261122-183210-ffff", str(a.resolve()), created_at=100.0)
    a_new = record("mnist-20261122-183210-0000", str(a.resolve()), created_at=200.0)
    b_newest = record("mnist-20261122-183210-8888", str(b.resolve()), created_at=300.0)
    for r in (a_new, b_newest, a_old):
        store.save(r)
    assert latest_id(store, a) == a_new.run_id
    assert latest_id(store, b) == b_newest.run_id
    assert store.latest(tmp_path / "c" / "cluster.yaml") is None
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert latest_id(store, Path("cluster.yaml")) == a_new.run_id  # relative path: same file
    assert latest_id(store, Path("../b/./cluster.yaml")) == b_newest.run_id


def test_latest_of_an_empty_store_is_none(store: RunStore, tmp_path: Path) -> None:
    assert store.latest(tmp_path / "cluster.yaml") is None
    assert not store.home.exists()  # reading creates nothing


def test_all_is_oldest_first(store: RunStore) -> None:
    runs = [record(f"m-20260101-00000{i}-abcd", created_at=t) for i, t in enumerate((30.0, 10.0, 20.0))]
    for r in runs:
        store.save(r)
    assert [r.created_at for r in store.all()] == [10.0, 20.0, 30.0]


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        b'{"run_id": "x"}',  # missing keys
        b"[1, 2]",  # not an object
        b"null",
        b'"text"',
        b'{"run_id": "x", "cluster_name": "m", "cluster_file": "f", "created_at": 1, "tasks": [{"job": "ps"}], '
        b'"hosts": [], "grace_period": 1}',  # a task missing fields
        b"\xff\xfe\x00garbage",  # not UTF-8
    ],
)
def test_all_skips_a_corrupt_run_json(store: RunStore, content: bytes) -> None:
    good1, good2 = record("m-1", created_at=1.0), record("m-2", created_at=2.0)
    store.save(good1)
    store.save(good2)
    bad = store.runs_dir / "m-bad"
    bad.mkdir()
    (bad / "run.json").write_bytes(content)
    (store.runs_dir / "m-empty-dir").mkdir()  # a run dir without run.json
    assert [r.run_id for r in store.all()] == ["m-1", "m-2"]


@pytest.mark.parametrize("created_at", [None, "yesterday"])
def test_all_skips_a_run_json_with_a_non_numeric_created_at(store: RunStore, created_at) -> None:
    store.save(record("m-1", created_at=1.0))
    store.save(record("m-2", created_at=2.0))
    bad = store.runs_dir / "m-bad"
    bad.mkdir()
    data = record("m-bad").to_json()
    data["created_at"] = created_at
    (bad / "run.json").write_text(json.dumps(data))
    assert [r.run_id for r in store.all()] == ["m-1", "m-2"]
    assert latest_id(store, Path("/srv/a/cluster.yaml")) == "m-2"


def test_load_of_a_corrupt_run_is_a_tfctl_error(store: RunStore) -> None:
    from tfctl.errors import TfctlError

    store.save(record())
    (store.run_dir(record().run_id) / "run.json").write_text("{half a rec")
    with pytest.raises(TfctlError):
        store.load(record().run_id)


def test_all_of_a_missing_store_is_empty(store: RunStore) -> None:
    assert store.all() == []


# --- modes, atomicity ----------------------------------------------------------------------------


def test_home_and_run_dir_are_private(store: RunStore) -> None:
    old = os.umask(0o022)
    try:
        store.save(record())
    finally:
        os.umask(old)
    assert mode(store.home) == 0o700
    assert mode(store.run_dir(record().run_id)) == 0o700
    assert mode(store.run_dir(record().run_id) / "run.json") & 0o077 == 0


def test_existing_open_home_is_made_private(store: RunStore) -> None:
    store.home.mkdir(mode=0o755)
    os.chmod(store.home, 0o755)
    with store.lock():
        pass
    assert mode(store.home) == 0o700


def test_default_home_is_tfctl_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TFCTL_HOME", str(tmp_path / "h"))
    assert tfctl_home() == tmp_path / "h"
    assert RunStore().home == tmp_path / "h"
    assert not (tmp_path / "h").exists()  # constructing touches nothing
    monkeypatch.delenv("TFCTL_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert tfctl_home() == tmp_path / "me" / ".tfctl"


def test_saves_leave_no_temp_files(store: RunStore) -> None:
    r = record()
    for i in range(20):
        store.save(record(reason=f"save {i}"))
    assert sorted(p.name for p in store.run_dir(r.run_id).iterdir()) == ["run.json"]
    assert store.load(r.run_id).reason == "save 19"


def test_failed_save_keeps_the_old_record_and_leaves_no_temp_file(store: RunStore) -> None:
    r = record()
    store.save(r)
    with pytest.raises(TypeError):
        store.save(record(unreachable={"gpu1": object()}))
    assert store.load(r.run_id) == r  # the rename never happened: the old record is intact
    assert sorted(p.name for p in store.run_dir(r.run_id).iterdir()) == ["run.json"]


def test_reader_never_sees_a_partial_file(store: RunStore) -> None:
    # A biggish record (~30 KB, written in several chunks) so a non-atomic write would be seen half-done.
    big_env = {f"VAR_{i}": "x" * 60 for i in range(400)}
    base = record()
    base = base.replace(tasks=(base.tasks[0].replace(env=big_env),) + base.tasks[1:])
    store.save(base)
    path = store.run_dir(base.run_id) / "run.json"
    done = threading.Event()
    problems: list[str] = []
    reads = [0]
    seen: set[str] = set()

    def reader() -> None:
        while not done.is_set():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                problems.append(repr(e)[:200])
                continue
            if len(data["tasks"][0]["env"]) != len(big_env):
                problems.append("incomplete record")
            seen.add(data["reason"] or "")
            reads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(200):
            store.save(base.replace(reason=f"write {i}"))
    finally:
        done.set()
        thread.join(30)
    assert not problems, problems[:5]
    assert reads[0] > 0
    assert len(seen) > 1  # the reader really read while the writer rewrote
    assert store.load(base.run_id).reason == "write 199"
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]


# --- locking across processes --------------------------------------------------------------------


def _update_reason(home: str, run_id: str, me: int, count: int) -> None:
    store = RunStore(Path(home))
    for n in range(count):
        reason = functools.partial(_with_reason, f"p{me}-{n}")
        transitions.apply(store, run_id, Transition("test", Guard.RECORDED, reason))


def _with_reason(reason: str, record: RunRecord) -> RunRecord:
    return record.replace(reason=reason)


def _increment(home: str, counter: str, count: int) -> None:
    store = RunStore(Path(home))
    for _ in range(count):
        with store.lock():
            value = int(Path(counter).read_text())
            time.sleep(0.0002)  # widen the read-modify-write window: without the lock, updates get lost
            Path(counter).write_text(str(value + 1))


def _join(procs: list) -> None:
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_update_from_several_processes(store: RunStore) -> None:
    r = record()
    store.save(r)
    path = store.run_dir(r.run_id) / "run.json"
    procs = [CTX.Process(target=_update_reason, args=(str(store.home), r.run_id, i, 25)) for i in range(4)]
    for p in procs:
        p.start()
    parse_errors, reads = [], 0
    while any(p.is_alive() for p in procs):
        try:
            json.loads(path.read_text())
            reads += 1
        except (OSError, ValueError) as e:
            parse_errors.append(repr(e))
    _join(procs)
    assert parse_errors == []
    final = store.load(r.run_id)
    # The last update of all is the last update of whichever process finished last.
    assert final.reason in {f"p{i}-24" for i in range(4)}
    assert final.replace(reason=None) == r  # nothing else changed
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]


def test_lock_serialises_read_modify_write_across_processes(store: RunStore, tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    procs = [CTX.Process(target=_increment, args=(str(store.home), str(counter), 50)) for _ in range(4)]
    for p in procs:
        p.start()
    _join(procs)
    assert counter.read_text() == "200"


def test_a_transition_returns_and_stores_the_new_record(store: RunStore) -> None:
    r = record()
    store.save(r)
    new = transitions.apply(store, r.run_id, transitions.end_if_active(RunState.SUCCEEDED, "worker:0 finished", 5.0))
    assert new is not None and (new.state, new.reason, new.ended_at) == ("succeeded", "worker:0 finished", 5.0)
    assert store.load(r.run_id) == new
    assert new.tasks == r.tasks


def test_a_transition_of_an_unknown_run_changes_nothing(store: RunStore) -> None:
    assert transitions.apply(store, "nope-20260101-000000-0000", transitions.mark_running()) is None
    assert store.all() == []


def test_a_transition_that_raises_changes_nothing(store: RunStore) -> None:
    r = record()
    store.save(r)
    with pytest.raises(TypeError):
        transitions.apply(store, r.run_id, Transition("bad", Guard.RECORDED, lambda x: x.replace(no_such_field=1)))
    assert store.load(r.run_id) == r


# --- run ids, unknown runs -----------------------------------------------------------------------


def test_new_run_id_format() -> None:
    now = time.mktime((2026, 11, 22, 18, 32, 10, 0, 0, -1))
    run_id = new_run_id("mnist", now)
    assert re.fullmatch(r"mnist-20261122-183210-[0-9a-f]{4}", run_id), run_id


def test_new_run_id_of_a_name_with_dots_and_dashes_now() -> None:
    # time.strftime() alone reads C's time(), a coarse clock that can lag time.time() by a tick
    before = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time()))
    run_id = new_run_id("my.cluster-1")
    after = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time()))
    m = re.fullmatch(r"my\.cluster-1-(\d{8}-\d{6})-([0-9a-f]{4})", run_id)
    assert m, run_id
    assert before <= m.group(1) <= after


def test_new_run_ids_differ_within_one_second() -> None:
    ids = {new_run_id("m", 1_795_000_000.0) for _ in range(30)}
    assert len(ids) > 1


@pytest.mark.parametrize("home_exists", [False, True])
def test_load_of_an_unknown_run_is_a_usage_error_exit_2(store: RunStore, home_exists: bool) -> None:
    if home_exists:
        store.save(record())
    with pytest.raises(UsageError) as caught:
        store.load("nope-20260101-000000-0000")
    assert caught.value.exit_code == EXIT_USAGE == 2
    assert "nope-20260101-000000-0000" in caught.value.message
    assert caught.value.hint and "tfctl runs" in caught.value.hint


def test_create_refuses_a_run_id_that_is_taken(store: RunStore) -> None:
    from tfctl.errors import UsageError

    store.create(record())
    with pytest.raises(UsageError, match="already taken"):
        store.create(record())
