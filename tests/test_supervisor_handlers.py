"""The supervisor's handlers in this process: the wire loop, the journal, sync, tail and follow,
task state from its files, ports and probes. (test_supervisor.py drives the shipped zipapp with
real tasks; these pin the logic underneath, fast and with exact inputs.)"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench.waiting import wait_until
from tfctl.supervisor import (
    checks,
    distinfo,
    files,
    journal,
    logs,
    monitor,
    procfs,
    prune,
    serve,
    state,
    stream,
    sync,
    tasks,
)
from tfctl.supervisor import protocol as p
from tfctl.supervisor.errors import AgentError
from tfctl.supervisor.files import task_dir, write_json


def converse(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> list[dict[str, Any]]:
    """Run `serve` over these input lines; its answers, parsed."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(lines).encode())))
    monkeypatch.setattr(sys, "stdout", out)
    serve.serve()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def wire(request_id: str, root: Path, request: p.Request[Any] | stream.FollowRequest, verb: str | None = None) -> str:
    body = request.to_wire()
    return json.dumps({"id": request_id, "verb": verb or request.VERB, "root": str(root), "req": body}) + "\n"


def test_serve_answers_each_envelope_in_order_and_survives_bad_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = converse(
        monkeypatch,
        [
            wire("a", tmp_path, p.PortsRequest([1])),
            "not json\n",
            "\n",
            json.dumps({"id": "b", "verb": "explode", "root": str(tmp_path), "req": {}}) + "\n",
            wire("c", tmp_path, p.StatusRequest("r", {"worker:0": 1})),
        ],
    )
    assert answers[0] == {"id": "a", "ok": {"ports": {"1": {"listening": False, "pids": [], "command": ""}}}}
    assert "error" in answers[1] and answers[1]["id"] == ""
    assert answers[2] == {"id": "b", "error": "unknown verb 'explode'"}
    status = p.StatusAnswer.from_wire(answers[3]["ok"])
    assert answers[3]["id"] == "c" and status.tasks["worker:0"].state is p.TaskState.PENDING


def test_a_failing_handler_is_an_error_answer_not_the_end(tmp_path: Path) -> None:
    request = p.TailRequest("r", ["worker:0"], lines=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(serve.HANDLERS, "tail", lambda root, req: 1 / 0)
        answer = serve.run(str(tmp_path), request, "x")
    assert answer == {"id": "x", "error": "`tail` failed: ZeroDivisionError: division by zero"}


def test_journal_runs_once_per_id_and_refuses_odd_ids(tmp_path: Path) -> None:
    calls: list[int] = []

    def work() -> dict[str, Any]:
        calls.append(1)
        return {"id": "r1", "ok": {"n": len(calls)}}

    first = journal.once(str(tmp_path), "r1", work)
    again = journal.once(str(tmp_path), "r1", work)
    assert first == again == {"id": "r1", "ok": {"n": 1}} and calls == [1]
    assert journal.once(str(tmp_path), "r2", work)["ok"] == {"n": 2}
    with pytest.raises(Exception, match="not a plain word"):
        journal.once(str(tmp_path), "../etc", work)


def manifest(files: dict[str, bytes]) -> dict[str, p.FileEntry]:
    return {rel: p.FileEntry(hashlib.sha256(data).hexdigest(), len(data), 0o644) for rel, data in files.items()}


def test_sync_sends_only_what_changed_and_each_run_gets_its_own_copy(tmp_path: Path) -> None:
    cache, root = str(tmp_path / "cache"), str(tmp_path)
    v1 = {"train.py": b"print(1)\n", "lib/util.py": b"X = 1\n", "old.txt": b"gone soon"}
    assert sorted(sync.sync_plan(root, p.SyncPlanRequest(cache, manifest(v1))).need) == sorted(v1)
    blobs = {rel: base64.b64encode(data).decode() for rel, data in v1.items()}
    done = sync.sync_apply(root, p.SyncApplyRequest(cache, str(tmp_path / "run1"), manifest(v1), blobs))
    assert (done.copied, done.files) == (3, 3)
    assert (tmp_path / "run1" / "lib" / "util.py").read_bytes() == b"X = 1\n"

    v2 = {"train.py": b"print(2)\n", "lib/util.py": b"X = 1\n"}
    need = sync.sync_plan(root, p.SyncPlanRequest(cache, manifest(v2))).need
    assert need == ["train.py"]
    blobs = {"train.py": base64.b64encode(v2["train.py"]).decode()}
    sync.sync_apply(root, p.SyncApplyRequest(cache, str(tmp_path / "run2"), manifest(v2), blobs))
    assert (tmp_path / "run2" / "train.py").read_bytes() == b"print(2)\n"
    assert not (tmp_path / "run2" / "old.txt").exists() and not (tmp_path / "cache" / "old.txt").exists()
    assert (tmp_path / "run1" / "train.py").read_bytes() == b"print(1)\n"  # a running task's copy never changes


def test_syncs_of_one_cache_at_once_each_copy_the_whole_tree(tmp_path: Path) -> None:
    """Two trials of a sweep start together: each run's copy is whole, none sees the other's
    temporary files (before the lock, a copy failed on a manifest renamed under it)."""
    cache, root = str(tmp_path / "cache"), str(tmp_path)
    tree = {f"m{i}.py": b"x" * 2000 for i in range(40)}
    blobs = {rel: base64.b64encode(data).decode() for rel, data in tree.items()}
    errors: list[BaseException] = []

    def one(n: int) -> None:
        try:
            sync.sync_apply(root, p.SyncApplyRequest(cache, str(tmp_path / f"run{n}"), manifest(tree), blobs))
        except BaseException as e:  # noqa: BLE001 (collected for the assert)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(sorted(os.listdir(tmp_path / f"run{n}")) == sorted(tree) for n in range(8))


def test_a_sync_whose_plan_another_sync_overtook_is_refused(tmp_path: Path) -> None:
    cache, root = str(tmp_path / "cache"), str(tmp_path)
    v1, v2 = {"train.py": b"print(1)\n"}, {"train.py": b"print(2)\n"}
    blobs = {"train.py": base64.b64encode(v1["train.py"]).decode()}
    sync.sync_apply(root, p.SyncApplyRequest(cache, str(tmp_path / "run1"), manifest(v1), blobs))
    # Planned when the cache had v2 (so nothing sent), applied after v1 was written over it:
    with pytest.raises(AgentError, match="changed while this run synced it"):
        sync.sync_apply(root, p.SyncApplyRequest(cache, str(tmp_path / "run2"), manifest(v2), {}))
    assert not (tmp_path / "run2").exists()


def write_log(root: Path, run: str, task: str, data: bytes) -> Path:
    d = Path(task_dir(str(root), run, task))
    d.mkdir(parents=True, exist_ok=True)
    (d / "output.log").write_bytes(data)
    return d


def test_tail_and_tail_offset(tmp_path: Path) -> None:
    d = write_log(tmp_path, "r", "worker:0", b"".join(b"line %d\n" % i for i in range(10)))
    path = str(d / "output.log")
    assert logs.tail(str(tmp_path), p.TailRequest("r", ["worker:0", "ps:0"], 3)).tails == {
        "worker:0": ["line 7", "line 8", "line 9"],
        "ps:0": [],
    }
    assert logs.tail_offset(path, 0) == os.path.getsize(path)
    assert logs.tail_offset(path, 100) == 0
    assert logs.last_line(path) == "line 9"


def test_follow_without_follow_reads_what_is_there_including_a_partial_line(tmp_path: Path) -> None:
    write_log(tmp_path, "r", "worker:0", b"a\nb\npartial")
    events = list(logs.follow(str(tmp_path), stream.FollowRequest("r", {"worker:0": 2})))
    assert events == [stream.LogChunk("worker:0", 11, b"b\npartial")]


def test_follow_announces_the_end_of_a_task_after_its_last_bytes(tmp_path: Path) -> None:
    d = write_log(tmp_path, "r", "worker:0", b"one\ntwo\n")
    write_json(str(d / "proc.json"), {"pid": 1, "pgid": 1, "starttime": 0, "started_at": 1.0})
    write_json(str(d / "exit.json"), {"exit_code": 0, "signal": None, "ended_at": 2.0})
    events = list(logs.follow(str(tmp_path), stream.FollowRequest("r", {"worker:0": 0}, follow=True)))
    assert events == [
        stream.LogChunk("worker:0", 8, b"one\ntwo\n"),
        stream.TaskEnded("worker:0", 8, p.TaskState.SUCCEEDED),
    ]


def test_task_state_from_its_files(tmp_path: Path) -> None:
    root, me = str(tmp_path), procfs.proc_stat(os.getpid())
    assert me is not None
    assert state.task_state(root, "r", "ps:0").state is p.TaskState.PENDING
    d = Path(task_dir(root, "r", "ps:0"))
    d.mkdir(parents=True)
    assert state.task_state(root, "r", "ps:0").state is p.TaskState.STARTING
    alive = {"pid": os.getpid(), "pgid": me["pgid"], "starttime": me["starttime"], "started_at": time.time()}
    write_json(str(d / "proc.json"), alive)
    assert state.task_state(root, "r", "ps:0").state is p.TaskState.RUNNING
    write_json(str(d / "proc.json"), {**alive, "starttime": me["starttime"] + 1})  # a reused pid
    assert state.task_state(root, "r", "ps:0").state is p.TaskState.LOST
    write_json(str(d / "exit.json"), {"exit_code": None, "signal": 9, "ended_at": time.time()})
    info = state.task_state(root, "r", "ps:0")
    assert info.state is p.TaskState.FAILED and info.signal == 9
    write_json(str(d / "stop.json"), {"requested_at": 0.0})
    assert state.task_state(root, "r", "ps:0").state is p.TaskState.STOPPED


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ({"exit.json": {"exit_code": 0, "signal": None, "ended_at": 2.0}}, p.TaskState.SUCCEEDED),
        ({"exit.json": {"exit_code": 3, "signal": None, "ended_at": 2.0}}, p.TaskState.FAILED),
        ({"exit.json": {"exit_code": 143, "ended_at": 2.0}, "stop.json": {"requested_at": 1.0}}, p.TaskState.STOPPED),
        ({}, p.TaskState.LOST),  # the monitor died without writing it: the code is lost
    ],
)
def test_a_task_whose_monitor_wrote_its_end_and_left_while_it_was_read_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: dict, expected: p.TaskState
) -> None:
    """The task ends at once; between the read of exit.json and the look at its monitor, the
    monitor writes the end and leaves (CI saw such a task, which exited 0, called lost)."""
    root = str(tmp_path)
    d = Path(task_dir(root, "r", "worker:0"))
    d.mkdir(parents=True)
    monitor = {"pid": 2, "starttime": 1}
    write_json(str(d / "proc.json"), {"pid": 1, "pgid": 1, "starttime": 1, "started_at": 1.0, "monitor": monitor})

    def is_same_process(record: dict) -> bool:
        if record == monitor:  # the monitor, looked at: it wrote the end, then left
            for name, data in written.items():
                write_json(str(d / name), data)
        return False

    monkeypatch.setattr(state.procfs, "is_same_process", is_same_process)
    info = state.task_state(root, "r", "worker:0")
    assert info.state is expected
    assert info.exit_code == written.get("exit.json", {}).get("exit_code")


def test_ports_and_probe_see_a_listener(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        info = checks.ports(str(tmp_path), p.PortsRequest([port])).ports[str(port)]
        assert info.listening and os.getpid() in info.pids
        results = checks.probe(str(tmp_path), p.ProbeRequest([f"127.0.0.1:{port}", "no-such-host.invalid:1"])).results
    assert results[f"127.0.0.1:{port}"].ok and results[f"127.0.0.1:{port}"].local
    assert results["no-such-host.invalid:1"].error == "unresolvable"
    refused = checks.probe(str(tmp_path), p.ProbeRequest([f"127.0.0.1:{port}"])).results[f"127.0.0.1:{port}"]
    assert not refused.ok and refused.error == "refused"


def test_info_names_this_interpreter(tmp_path: Path) -> None:
    answer = checks.info(str(tmp_path), p.InfoRequest(sys.executable))
    assert answer.hostname == socket.gethostname()
    assert answer.python == sys.version.split()[0] and answer.python_error is None
    broken = checks.info(str(tmp_path), p.InfoRequest(str(tmp_path / "no-python")))
    assert broken.python is None and broken.python_error


def test_dist_version_agrees_with_importlib_metadata_on_every_installed_distribution() -> None:
    from importlib import metadata

    names = {d.metadata["Name"] for d in metadata.distributions()}
    assert len(names) > 10  # this environment's packages: tensorflow, click, PyYAML, ...
    for name in sorted(names):
        assert distinfo.dist_version([name], sys.path) == f"{name} {metadata.version(name)}", name


def test_dist_version_takes_names_then_paths_in_order_and_reads_each_kind(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "tensorflow_cpu-2.1.0.dist-info").mkdir(parents=True)
    (first / "tensorflow_cpu-2.1.0.dist-info" / "METADATA").write_text("Name: tensorflow-cpu\nVersion: 2.1.0\n")
    (second / "tensorflow-2.2.0.egg-info").mkdir(parents=True)
    (second / "tensorflow-2.2.0.egg-info" / "PKG-INFO").write_text("Name: tensorflow\nVersion: 2.2.0\n")
    (second / "tf_nightly-3.0.egg-info").write_text("Name: tf-nightly\nVersion: 3.0.dev1\n")
    paths = [str(tmp_path / "missing"), str(first), str(second)]
    assert distinfo.dist_version(["tensorflow", "tensorflow-cpu"], paths) == "tensorflow 2.2.0"
    assert distinfo.dist_version(["tensorflow-cpu", "tensorflow"], paths) == "tensorflow-cpu 2.1.0"
    assert distinfo.dist_version(["tf-nightly"], paths) == "tf-nightly 3.0.dev1"
    assert distinfo.dist_version(["tensorflow-macos"], paths) is None


def test_hosts_sharing_a_home_answer_the_same_filesystem_token(tmp_path: Path) -> None:
    shared, other = str(tmp_path / "nfs-home" / ".tfctl"), str(tmp_path / "own-home" / ".tfctl")
    cache = str(tmp_path / "cache")
    first = sync.sync_plan(shared, p.SyncPlanRequest(cache, {})).filesystem
    assert first and sync.sync_plan(shared, p.SyncPlanRequest(cache, {})).filesystem == first
    assert sync.sync_plan(other, p.SyncPlanRequest(cache, {})).filesystem not in ("", first)
    assert not [n for n in os.listdir(shared) if ".tmp." in n]


def test_one_host_per_filesystem_is_synced() -> None:
    from tfctl.controller.start.workdir_sync import one_per_filesystem

    plans = {
        "h3": p.SyncPlanAnswer([], "nfs"),
        "h1": p.SyncPlanAnswer([], "nfs"),
        "h2": p.SyncPlanAnswer([], "local-h2"),
        "h4": p.SyncPlanAnswer([], ""),  # an older supervisor: no token, synced on its own
    }
    assert one_per_filesystem({h: plan.filesystem for h, plan in plans.items()}) == {"h1": ["h3"], "h2": [], "h4": []}


def test_state_is_kept_per_host_under_a_shared_root(tmp_path: Path) -> None:
    from tfctl.supervisor import files

    own = files.state_root(str(tmp_path))
    assert own == str(tmp_path / "hosts" / files.host_key())
    assert files.host_key().startswith(socket.gethostname().replace(" ", "_"))
    assert files.task_dir(str(tmp_path), "r", "ps:0").startswith(own + os.sep)
    assert files.host_key() in files.unique_temp(str(tmp_path / "x.json"))


def test_hosts_sharing_a_home_leave_the_runs_directory_to_the_last_of_them(tmp_path: Path) -> None:
    """Each host forgets its own task state; the run's directory (synced code, checkpoints), one
    for all of them on a shared home, goes only once no other host keeps state of the run."""
    run = "t-20260101-100000-0001"
    mine = Path(files.run_dir(str(tmp_path), run))
    other = tmp_path / "hosts" / "!other-host" / "tasks" / run  # its key sorts before any host key
    shared = Path(files.work_dir(str(tmp_path), run))
    for d in (mine / "worker-0", other / "worker-1", shared):
        d.mkdir(parents=True)
    (shared / "ckpt").write_bytes(b"x" * 100)

    # A dry run while both hosts keep state: the run's directory is reported by one of them only.
    dry = prune.prune(str(tmp_path), p.PruneRequest([run], dry_run=True))
    assert dry.paths[run] == [str(mine), str(shared)] and dry.sizes[run] == 100

    first = prune.prune(str(tmp_path), p.PruneRequest([run]))
    assert first.paths[run] == [str(mine)] and not mine.exists()
    assert shared.is_dir() and other.is_dir()  # the other host still holds the run

    shutil.rmtree(other)  # the other host forgets the run too (as its own prune would)
    last = prune.prune(str(tmp_path), p.PruneRequest([run]))
    assert last.paths[run] == [str(shared)] and last.sizes[run] == 100 and not shared.exists()


def test_a_slurm_runs_state_of_every_node_is_pruned_from_one_place(tmp_path: Path) -> None:
    """The nodes of an allocation that is over keep their state under the shared root: the
    machine that prunes removes every node's state of the run, and the run's directory."""
    run, kept_run = "t-20260101-100000-0001", "t-20260101-110000-0002"
    nodes = [tmp_path / "hosts" / key / "tasks" for key in ("node-a", "node-b")]
    for d in [n / run / "ps-0" for n in nodes] + [nodes[0] / kept_run / "worker-0"]:
        d.mkdir(parents=True)
    shared = Path(files.work_dir(str(tmp_path), run))
    shared.mkdir(parents=True)
    answer = prune.prune(str(tmp_path), p.PruneRequest([run], every_host=True))
    assert answer.paths[run] == [str(n / run) for n in nodes] + [str(shared)]
    assert not any((n / run).exists() for n in nodes) and not shared.exists()
    assert (nodes[0] / kept_run).is_dir()  # another run's state is not touched


def test_sock_diag_sees_the_sockets_proc_net_tcp_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """The netlink answer (cheap) and /proc/net/tcp (what it replaces) agree, IPv4 and IPv6."""
    from tfctl.supervisor import sockdiag

    with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6, socket.socket() as client:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        v6.bind(("::1", 0))
        v6.listen()
        client.connect(v4.getsockname())
        listening = sockdiag.tcp_sockets(int(procfs.TCP_LISTEN, 16))
        established = sockdiag.tcp_sockets(int(procfs.TCP_ESTABLISHED, 16))
        assert listening is not None and established is not None
        assert v4.getsockname()[1] in listening and v6.getsockname()[1] in listening
        assert client.getsockname()[1] in established
        monkeypatch.setattr(sockdiag, "tcp_sockets", lambda state: None)  # as where netlink is missing
        from_proc = procfs.tcp_sockets(procfs.TCP_LISTEN)
        for port in (v4.getsockname()[1], v6.getsockname()[1]):  # other processes' sockets come and go
            assert from_proc[port] == listening[port]
        port = client.getsockname()[1]
        assert procfs.tcp_sockets(procfs.TCP_ESTABLISHED)[port] == established[port]


def test_a_listening_task_is_found_in_its_process_tree_without_reading_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` runs every half second for the life of a run: finding the socket's owner among
    the task's descendants costs a few reads, a walk through every process ~15 ms each time."""
    import subprocess

    from tfctl.supervisor import tasks

    ready = tmp_path / "port"
    child = (
        "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
        f"open({str(ready)!r},'w').write(str(s.getsockname()[1])); time.sleep(60)"
    )
    shell = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "{child}"; true'])  # the listener is a child
    try:
        written = wait_until(
            lambda: ready.read_text() if ready.exists() else "", 10, "the listener's port", interval=0.02
        )
        port = int(written)
        st = procfs.proc_stat(shell.pid)
        assert st is not None
        proc = {"pid": shell.pid, "starttime": st["starttime"], "pgid": st["pgid"]}

        def every_process(*_args: object) -> list[int]:
            raise AssertionError("read every process")

        monkeypatch.setattr(procfs, "task_processes", every_process)
        assert tasks._owns(procfs.listening_sockets()[port], "run", "ps:0", proc)
    finally:
        for pid in procfs.descendants(shell.pid)[::-1]:
            os.kill(pid, 9)
        shell.wait()


def test_a_chunk_crosses_the_wire_byte_for_byte_even_cut_inside_a_character(tmp_path: Path) -> None:
    # A line longer than a chunk is sent in pieces; the cut falls inside a 3-byte character, and
    # the log also holds bytes that are not UTF-8 at all.
    line = "x" * (logs.CHUNK - 1) + "€ tail"
    raw = line.encode() + b"\n\xff\xfe not utf-8\n"
    write_log(tmp_path, "r", "worker:0", raw)
    events = list(logs.follow(str(tmp_path), stream.FollowRequest("r", {"worker:0": 0})))
    first = events[0]
    assert (
        len(events) == 2 and isinstance(first, stream.LogChunk) and first.data == raw[: logs.CHUNK]
    )  # cut mid-character
    received = [stream.follow_event_from_wire(json.loads(json.dumps(stream.follow_event_to_wire(e)))) for e in events]
    assert received == events
    assert b"".join(e.data for e in received if isinstance(e, stream.LogChunk)) == raw


@pytest.mark.parametrize("inotify", [True, False])
def test_a_followed_idle_task_costs_a_state_read_a_second_and_output_arrives_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    if not inotify:  # as on a host without it: polls, but reads the state only once a second
        monkeypatch.setattr(logs.Changes, "open", staticmethod(lambda: None))
    d = write_log(tmp_path, "r", "worker:0", b"first\n")
    me = procfs.proc_stat(os.getpid())
    assert me is not None
    write_json(str(d / "proc.json"), {"pid": os.getpid(), "pgid": me["pgid"], "starttime": me["starttime"]})
    reads: list[float] = []
    real_state = logs.task_state

    def counted_state(*a):
        reads.append(time.monotonic())
        return real_state(*a)

    monkeypatch.setattr(logs, "task_state", counted_state)
    events = logs.follow(str(tmp_path), stream.FollowRequest("r", {"worker:0": 0}, follow=True))
    assert next(events) == stream.LogChunk("worker:0", 6, b"first\n")
    got: list[tuple[float, stream.FollowEvent]] = []
    reader = threading.Thread(target=lambda: got.extend((time.monotonic(), e) for e in events), daemon=True)
    reader.start()
    time.sleep(2.5)  # deliberately: count the state reads of an idle follow over 2.5 s
    assert len(reads) <= 5  # polling every 0.01 s would read it 250 times
    written = time.monotonic()
    with open(d / "output.log", "ab") as f:
        f.write(b"second\n")
    write_json(str(d / "exit.json"), {"exit_code": 0, "signal": None, "ended_at": time.time()})
    reader.join(5)
    assert [e for _, e in got] == [
        stream.LogChunk("worker:0", 13, b"second\n"),
        stream.TaskEnded("worker:0", 13, p.TaskState.SUCCEEDED),
    ]
    if inotify and logs.Changes.open() is not None:  # woken by the write, not by the next state read
        assert got[-1][0] - written < 0.5


def test_a_monitor_waits_for_its_task_asleep_and_sees_it_end_at_once() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    with monitor._ExitWatch(child) as ended:
        started = time.monotonic()
        assert ended(0.1) is None
        assert ended(10) == 0
        assert time.monotonic() - started < 3


EXIT_MAIN_THREAD_FIRST = """
import ctypes, os, socket, sys, threading, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
threading.Thread(target=lambda: (time.sleep(float(sys.argv[1])), os._exit(0))).start()
ctypes.CDLL(None).pthread_exit(None)  # the main thread goes; its process lingers in its threads
"""


def test_a_port_held_by_a_process_still_exiting_is_free_once_it_has_exited() -> None:
    """A stopped process whose main thread has gone counts as gone, while its other threads
    (TensorFlow freeing its heap) hold its listening socket for seconds more: `down` waits for
    them rather than calling that port busy."""
    proc = subprocess.Popen([sys.executable, "-c", EXIT_MAIN_THREAD_FIRST, "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        wait_until(lambda: proc.pid not in procfs.live_pids(), 10, "its main thread gone")
        done = procfs.Termination(1, 0, [], [proc.pid])
        assert done.still_exiting()
        assert checks.port_owners([port])[str(port)].listening  # owned by nobody one can see
        assert not tasks.ports_after_stop([port], done.still_exiting, patience=0.1)[str(port)].listening
        assert proc.wait(timeout=10) == 0
        assert not done.still_exiting()
    finally:
        proc.kill()
        proc.wait()


def test_a_port_nobody_visible_holds_once_the_stopped_processes_are_gone_is_busy_after_a_moment() -> None:
    """Another user's listener (its owner unreadable) is waited for only a moment: no stopped
    process lingers that could still be closing it."""
    proc = subprocess.Popen([sys.executable, "-c", EXIT_MAIN_THREAD_FIRST, "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        wait_until(lambda: proc.pid not in procfs.live_pids(), 10, "its main thread gone")
        started = time.monotonic()
        assert tasks.ports_after_stop([port], lambda: False, patience=0.5)[str(port)].listening
        assert 0.5 <= time.monotonic() - started < 2
    finally:
        proc.kill()
        proc.wait()
