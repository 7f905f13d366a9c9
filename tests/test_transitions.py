"""The run record's named transitions (`tfctl/runs/transitions.py`) as tables: which records each
changes, what the races among them leave, and that nothing else in tfctl writes a record."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.fakes import record_of
from tfctl.cluster.cluster import Cluster
from tfctl.runs import transitions
from tfctl.runs.record import AllocationEnd, Controller, ControllerKind, HostSpec, Move, RunRecord, TrackerRun
from tfctl.runs.store import RunStore
from tfctl.runs.transitions import Transition
from tfctl.supervisor.protocol import RunState
from tfctl.transport.specs import SSHSpec

TFCTL = Path(__file__).resolve().parent.parent / "tfctl"
STOPPED, FAILED, SUCCEEDED = RunState.STOPPED, RunState.FAILED, RunState.SUCCEEDED
NEW_HOST = HostSpec("n1", None, "~/.tfctl", SSHSpec())
LINK = TrackerRun("mlflow", "r1", uri="http://127.0.0.1:5000")
LOST = HostSpec("h2", None, "~/.tfctl", SSHSpec())


def running() -> RunRecord:
    return record_of({"ps:0": "h1", "worker:0": "h1", "worker:1": "h2"}, run_id="a").replace(
        state=RunState.RUNNING, spares=("h3",), lost_hosts=(LOST,), created_at=1.0
    )


def ended() -> RunRecord:
    return running().replace(state=STOPPED, reason="tfctl down", ended_at=10.0)


# Each transition: what it changes on a running run, and whether an ended run takes it too.
TABLE = [
    (transitions.mark_running(), lambda r: r.state is RunState.RUNNING, False),
    (transitions.take_control(None, 5.0), lambda r: r.watcher is None and r.lease_timeout == 5.0, False),
    (transitions.note_hand_over({"job_id": "7"}), lambda r: r.backend_state == {"job_id": "7"}, False),
    (
        transitions.record_allocation((NEW_HOST,), {"job_id": "8"}, AllocationEnd("job 7", 5.0, "TIMEOUT")),
        lambda r: r.hosts == (NEW_HOST,) and r.state is RunState.STARTING and r.allocations[-1].why == "TIMEOUT",
        False,
    ),
    (transitions.mark_cut_off(), lambda r: r.cut_off, False),
    (transitions.begin_stop(15.0), lambda r: r.stopping_since == 15.0, False),
    (transitions.end_if_active(FAILED, "ps:0 exited", 20.0), lambda r: r.reason == "ps:0 exited", False),
    (transitions.record_plan((), ("ps:0",), {"tfctl": "1"}), lambda r: r.versions == {"tfctl": "1"}, True),
    (transitions.note_unreachable({"h2": 3.0}), lambda r: r.unreachable == {"h2": 3.0}, True),
    (
        transitions.record_move("h1", "h3", (), (Move(1.0, "worker:0", "h1", "h3", "lost"),)),
        lambda r: [h.name for h in r.hosts] == ["h2"] and r.spares == () and "h1" in [h.name for h in r.lost_hosts],
        True,
    ),
    (transitions.retire_host("h2"), lambda r: r.lost_hosts == (), True),
    (transitions.record_stop(True, (), {"wall": 1}), lambda r: r.left_nothing and r.accounting == {"wall": 1}, True),
    (transitions.record_accounting({"wall": 2}), lambda r: r.accounting == {"wall": 2}, True),
    (transitions.settle_scheduler_figures("slurm", {"cpu": 1}), lambda r: r.accounting == {"slurm": {"cpu": 1}}, True),
    (transitions.link_trackers((LINK,)), lambda r: r.tracking == (LINK,), True),
    (
        transitions.tracking_missed({"mlflow": ("the report",)}),
        lambda r: r.tracking == () or r.tracking[0].missed == ("the report",),
        True,
    ),
]


@pytest.mark.parametrize("transition, made, ended_too", TABLE, ids=[t.name for t, _m, _e in TABLE])
def test_each_transition_changes_what_it_names_and_only_the_runs_its_guard_admits(
    transition: Transition, made: object, ended_too: bool
) -> None:
    after = transition.on(running())
    assert after is not None and made(after)  # type: ignore[operator]
    assert after.run_id == "a" and after.created_at == running().created_at
    on_ended = transition.on(ended())
    if ended_too:
        assert on_ended is not None and made(on_ended) and on_ended.reason == "tfctl down"  # type: ignore[operator]
    else:
        assert on_ended is None  # an ended run keeps what its end said


def queued() -> RunRecord:
    return RunRecord("q", "c", "/c.yaml", 2.0, (), (), 5.0, state=RunState.QUEUED, priority=3, pool="/pool.yaml")


START = transitions.take_from_queue(running().replace(run_id="q", state=RunState.STARTING, created_at=9.0))
CANCEL = transitions.cancel_queued(40.0)
BACK = transitions.back_to_queue()


def test_a_run_taken_from_its_queue_goes_back_only_while_no_watcher_was_given_it() -> None:
    taken = START.on(queued())
    assert taken is not None and taken.watcher is None
    back = BACK.on(taken)
    assert back is not None and back.state is RunState.QUEUED and back.tasks == () and back.created_at == 2.0
    watched = transitions.take_control(running().watcher or _controller()).on(taken)
    assert watched is not None and BACK.on(watched) is None  # its watcher may have started tasks
    assert BACK.on(running()) is None  # not a queued run


def _controller() -> Controller:
    return Controller(ControllerKind.WATCHER, 123, 456)


# The queue's transitions take a queued run only: of a start and a cancel, whichever comes first.
QUEUE_RACES = [
    ("its start, then a cancel", [START, CANCEL], [True, False], RunState.STARTING),
    ("a cancel, then its start", [CANCEL, START], [True, False], STOPPED),
    ("two cancels", [CANCEL, CANCEL], [True, False], STOPPED),
    ("two starts (two drivers)", [START, START], [True, False], RunState.STARTING),
]


@pytest.mark.parametrize("steps, took, last", [r[1:] for r in QUEUE_RACES], ids=[r[0] for r in QUEUE_RACES])
def test_a_queued_run_is_started_or_cancelled_once(steps: list[Transition], took: list[bool], last: RunState) -> None:
    record, taken = queued(), []
    for step in steps:
        after = step.on(record)
        taken.append(after is not None)
        record = after or record
    assert taken == took and record.state is last
    if last is RunState.STARTING:  # what the submit said stays: when, how urgent, which pool
        assert (record.created_at, record.priority, record.pool, len(record.tasks)) == (2.0, 3, "/pool.yaml", 3)
    else:
        assert record.left_nothing and record.reason == "cancelled while queued"
    assert START.on(running()) is None and CANCEL.on(ended()) is None  # only a queued run


# Who tells a run's tracker runs of its end: the first of its controller and a `down` to get there,
# once the end is recorded; never a run still going.
CLOSE = transitions.close_trackers()
CLOSES = [
    ("a running run", running().replace(tracking=(LINK,)), [False]),
    ("an ended run", ended().replace(tracking=(LINK,)), [True]),
    ("an ended run, two closers", ended().replace(tracking=(LINK,)), [True, False]),
    ("an ended run without trackers", ended(), [False]),
    ("an ended run already told", ended().replace(tracking=(LINK.replace(closed=True),)), [False]),
]


@pytest.mark.parametrize("record, took", [c[1:] for c in CLOSES], ids=[c[0] for c in CLOSES])
def test_an_ended_runs_trackers_are_told_once(record: RunRecord, took: list[bool]) -> None:
    taken = []
    for _ in took:
        after = CLOSE.on(record)
        taken.append(after is not None)
        record = after or record
    assert taken == took
    if any(took):
        assert all(link.closed for link in record.tracking)


def test_every_transition_is_in_the_table() -> None:
    made = {t.name for t, _m, _e in TABLE} | {START.name, CANCEL.name, BACK.name, CLOSE.name}
    named = {
        node.args[0].value
        for node in ast.walk(ast.parse((TFCTL / "runs" / "transitions.py").read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Transition"
        if isinstance(node.args[0], ast.Constant)
    }
    assert named == made


DOWN = transitions.end_if_active(STOPPED, "tfctl down", 30.0)
OWN_END = transitions.end_if_active(SUCCEEDED, "job succeeded", 31.0)
START_FAILED = transitions.end_if_active(FAILED, "ps:0 exited before listening", 32.0)
NEW_ALLOCATION = transitions.record_allocation((NEW_HOST,), {"job_id": "8"}, AllocationEnd("job 7", 5.0, "PREEMPTED"))
RUNNING = transitions.mark_running()

# The interleavings, in the order they reach the store's lock: which steps take, and how the run
# stands after them.
RACES = [
    ("two downs", [DOWN, DOWN], [True, False], (STOPPED, "tfctl down")),
    ("down, then the run's own end", [DOWN, OWN_END], [True, False], (STOPPED, "tfctl down")),
    ("the run's own end, then a down", [OWN_END, DOWN], [True, False], (SUCCEEDED, "job succeeded")),
    (
        "a start that fails against a down",
        [START_FAILED, DOWN],
        [True, False],
        (FAILED, "ps:0 exited before listening"),
    ),
    ("down while the new allocation is asked for", [DOWN, NEW_ALLOCATION], [True, False], (STOPPED, "tfctl down")),
    ("a new allocation, then a down", [NEW_ALLOCATION, DOWN], [True, True], (STOPPED, "tfctl down")),
    ("a down before the tasks are marked running", [DOWN, RUNNING], [True, False], (STOPPED, "tfctl down")),
    (
        "a resubmission, its start, its end",
        [NEW_ALLOCATION, RUNNING, OWN_END],
        [True, True, True],
        (SUCCEEDED, "job succeeded"),
    ),
]


@pytest.mark.parametrize("steps, took, last", [r[1:] for r in RACES], ids=[r[0] for r in RACES])
def test_the_first_end_stays_whoever_comes_second(
    tmp_path: Path, steps: list[Transition], took: list[bool], last: tuple[RunState, str]
) -> None:
    store = RunStore(tmp_path / "home")
    store.create(running())
    assert [transitions.apply(store, "a", step) is not None for step in steps] == took
    record = store.load("a")
    assert (record.state, record.reason) == last and not record.active


def test_a_forgotten_run_takes_no_transition(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "home")
    store.create(running())
    transitions.forget(store, "a")
    assert transitions.apply(store, "a", transitions.record_accounting({"wall": 1})) is None
    assert store.all() == []


def test_a_clusters_copy_is_the_stored_record_after_every_transition(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "home")
    store.create(running())
    with Cluster(running()) as cluster:
        assert cluster.apply(store, transitions.note_unreachable({"h2": 1.0})) == cluster.record == store.load("a")
        transitions.apply(store, "a", DOWN)  # another process: a `down`
        assert cluster.apply(store, RUNNING) is None  # refused, and the copy learns the run ended
        assert cluster.record == store.load("a") and cluster.record.reason == "tfctl down"
        transitions.forget(store, "a")  # a start that failed before it put anything on a host
        assert cluster.apply(store, transitions.record_stop(True, (), None)) is None
        assert cluster.record.left_nothing  # this copy alone


def test_the_cluster_file_is_kept_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "home")
    store.create(running())
    transitions.keep_cluster_file(store, "a", "name: first\n")
    transitions.keep_cluster_file(store, "a", "name: edited\n")
    assert store.kept_cluster_file("a") == "name: first\n"


STORE_WRITES = {"create", "save", "forget"}


def _writes_elsewhere() -> list[str]:
    """Calls of the store's own writes, and Transitions made, outside the transitions module."""
    found = []
    for path in sorted(TFCTL.rglob("*.py")):
        rel = path.relative_to(TFCTL.parent).as_posix()
        if rel in ("tfctl/runs/transitions.py", "tfctl/runs/store.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in STORE_WRITES and "store" in ast.unparse(func.value):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(func)}")
            if ast.unparse(func).split(".")[-1] == "Transition":
                found.append(f"{rel}:{node.lineno}: a Transition of its own")
            if isinstance(func, ast.Attribute) and func.attr in ("write_text", "write_bytes", "replace"):
                if "run_dir" in ast.unparse(func.value) or "run.json" in ast.unparse(node):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_nothing_but_the_transitions_writes_a_record() -> None:
    assert _writes_elsewhere() == []


def test_the_write_check_finds_a_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a module that saves a record itself is found."""
    fake = tmp_path / "tfctl"
    (fake / "controller").mkdir(parents=True)
    (fake / "controller" / "sneaky.py").write_text("def f(store, r):\n    store.save(r.replace(reason='x'))\n")
    monkeypatch.setitem(globals(), "TFCTL", fake)
    assert _writes_elsewhere() == ["tfctl/controller/sneaky.py:2: store.save"]
