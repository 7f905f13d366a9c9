"""The controller's decisions against fake hosts: phase order, cleanup, patience, endings.

No process and no socket: `tests/fakes.py` answers the typed protocol for scripted tasks.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Hashable

import pytest

from tests.fakes import FakeHost, Journal, TaskScript, fake_hosts, record_of
from tfctl.cluster import control
from tfctl.cluster.cluster import Cluster
from tfctl.cluster.control import Phase
from tfctl.controller.live import driver, launch
from tfctl.controller.verbs import down, up
from tfctl.engine.clock import Cancel, FakeClock
from tfctl.engine.observed import TaskStatus
from tfctl.engine.reconcile import Action, NoteSilence, Rules, Ruling
from tfctl.engine.verdicts import Outcome
from tfctl.errors import HostError, StartupError, UsageError
from tfctl.runs.record import RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor import protocol as p
from tfctl.supervisor.protocol import RunState, TaskState

TASKS = {"ps:0": "h0", "worker:0": "h1", "worker:1": "h2"}


def make(
    scripts: dict[str, TaskScript] | None = None, tasks: dict[str, str] = TASKS, **record_args: Any
) -> tuple[Cluster, dict[str, FakeHost], Journal]:
    record = record_of(tasks, **record_args)
    journal = Journal()
    hosts = fake_hosts(record, journal, scripts)
    return Cluster(record, dict(hosts)), hosts, journal  # type: ignore[arg-type]


def ps_first(cluster: Cluster, wait_limit: float | None = None) -> list[Phase]:
    """The ordered start: ps (waited for, probed), then worker 0, then the rest."""
    task = cluster.record.task
    return [
        Phase((task("ps:0"),), ("ps:0",), probe=True),
        Phase((task("worker:0"),), ("worker:0",), wait_limit=wait_limit),
        Phase((task("worker:1"),)),
    ]


# ---------------------------------------------------------------- start


def test_phases_start_in_order_each_after_the_previous_listens() -> None:
    cluster, _hosts, journal = make({"ps:0": TaskScript(listen_after=3), "worker:0": TaskScript(listen_after=2)})
    messages: list[tuple[str, str]] = []
    control.start(cluster, ps_first(cluster), 5, lambda who, msg: messages.append((who, msg)), clock=FakeClock())
    order = [
        journal.index("start", "ps:0"),
        journal.index("probe"),
        journal.index("start", "worker:0"),
        journal.index("start", "worker:1"),
    ]
    assert order == sorted(order)
    # worker:0 starts only after a status answer said ps:0 listens (its third poll)
    ps_polls = [i for i, (_h, verb, d) in enumerate(journal.entries) if verb == "status" and d == "ps:0"]
    assert len(ps_polls) == 3 and ps_polls[-1] < journal.index("start", "worker:0")
    assert ("ps:0", "running (pid 1000)") in messages
    assert any(who == "ps:0" and msg.startswith("listening on h0:2222") for who, msg in messages)
    assert "stop" not in journal.verbs()


def test_a_failing_later_phase_stops_everything_started() -> None:
    cluster, hosts, journal = make()
    hosts["h2"].fail_verbs["start"] = HostError("h2", "disk full")
    with pytest.raises(HostError, match="disk full"):
        control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())
    stops = [i for i, (_h, verb, _d) in enumerate(journal.entries) if verb == "stop"]
    assert sorted(h for h, verb, _ in journal.entries if verb == "stop") == ["h0", "h1", "h2"]
    assert min(stops) > journal.index("start", "worker:1")
    assert hosts["h0"].tasks["ps:0"].state is TaskState.STOPPED
    assert hosts["h1"].tasks["worker:0"].state is TaskState.STOPPED


def test_a_host_that_cannot_be_checked_after_a_failed_start_is_named() -> None:
    cluster, hosts, _journal = make()
    hosts["h2"].fail_verbs["start"] = HostError("h2", "disk full")
    hosts["h1"].fail_verbs["stop"] = HostError("h1", "connection reset")
    messages: list[str] = []
    with pytest.raises(HostError, match="disk full"):
        control.start(
            cluster, ps_first(cluster), 5, lambda who, msg: messages.append(f"{who} {msg}"), clock=FakeClock()
        )
    assert "h1 could not be checked: h1: connection reset; run `tfctl down` once it answers" in messages


def test_a_task_that_cannot_start_fails_the_start_with_its_last_lines() -> None:
    cluster, hosts, journal = make({"worker:0": TaskScript(exits_at_start=True, lines=["Traceback", "ImportError: x"])})
    with pytest.raises(StartupError) as raised:
        control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())
    assert "worker:0 could not start: No such file or directory" in raised.value.message
    assert "last 2 lines of worker:0:\n  Traceback\n  ImportError: x" in raised.value.message
    assert "worker:1" not in ",".join(d for _h, verb, d in journal.entries if verb == "start")
    assert hosts["h0"].tasks["ps:0"].state is TaskState.STOPPED


def test_a_task_done_before_its_start_was_answered_is_no_start_failure() -> None:
    cluster, hosts, _journal = make()
    real_start = hosts["h2"]._start

    def start_and_finish(request: p.StartRequest) -> p.StartAnswer:
        answer = real_start(request)
        hosts["h2"].tasks["worker:1"] = p.TaskInfo("worker:1", TaskState.SUCCEEDED, exit_code=0)
        return p.StartAnswer({"worker:1": hosts["h2"].tasks["worker:1"]}) if answer.tasks else answer

    hosts["h2"]._start = start_and_finish  # type: ignore[method-assign]
    messages: list[str] = []
    control.start(cluster, ps_first(cluster), 5, lambda who, msg: messages.append(f"{who} {msg}"), clock=FakeClock())
    assert "worker:1 finished already (exit code 0)" in messages


@pytest.mark.parametrize(
    ("ended", "said"),
    [
        (p.TaskInfo("worker:1", TaskState.FAILED, exit_code=2), "worker:1 exited with code 2, right after it started"),
        (p.TaskInfo("worker:1", TaskState.FAILED, signal=9), "worker:1 was killed by signal 9 (SIGKILL"),
        (p.TaskInfo("worker:1", TaskState.LOST), "worker:1 was lost (its process is gone"),
    ],
)
def test_a_task_that_ended_before_its_start_was_answered_says_how(ended: p.TaskInfo, said: str) -> None:
    cluster, hosts, _journal = make()
    real_start = hosts["h2"]._start

    def start_and_end(request: p.StartRequest) -> p.StartAnswer:
        answer = real_start(request)
        hosts["h2"].tasks["worker:1"] = ended
        return p.StartAnswer({"worker:1": ended}) if answer.tasks else answer

    hosts["h2"]._start = start_and_end  # type: ignore[method-assign]
    with pytest.raises(StartupError) as raised:
        control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())
    assert said in raised.value.message


def test_a_task_that_exits_before_listening_fails_the_start() -> None:
    cluster, _hosts, _journal = make({"ps:0": TaskScript(listen_after=None, end_after=2, exit_code=3)})
    with pytest.raises(StartupError, match="ps:0 exited with code 3 before listening on port 2222"):
        control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())


def test_a_task_done_before_it_was_needed_is_not_waited_for() -> None:
    cluster, hosts, _journal = make({"worker:0": TaskScript(listen_after=None, end_after=1)})
    control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())
    assert hosts["h2"].tasks["worker:1"].state is TaskState.RUNNING


def test_not_listening_within_the_timeout_fails_unless_the_wait_is_only_a_hint() -> None:
    cluster, _hosts, _journal = make({"ps:0": TaskScript(listen_after=None)})
    with pytest.raises(StartupError, match=r"ps:0 did not listen on h0:2222 within 120s"):
        control.start(cluster, ps_first(cluster), timeout=120, clock=FakeClock())  # 2 minutes, on the fake clock

    cluster, hosts, _journal = make({"worker:0": TaskScript(listen_after=None)})
    messages: list[str] = []
    control.start(
        cluster,
        ps_first(cluster, wait_limit=30),
        timeout=120,
        progress=lambda who, msg: messages.append(f"{who} {msg}"),
        clock=FakeClock(),
    )
    assert "worker:0 not listening after 30s; starting the rest anyway" in messages
    assert hosts["h2"].tasks["worker:1"].state is TaskState.RUNNING


def test_ctrl_c_during_start_stops_what_was_started() -> None:
    cluster, hosts, journal = make({"ps:0": TaskScript(listen_after=None)})

    def interrupt_on_third_poll(request: p.Request[Any]) -> None:
        if request.VERB == "status" and journal.verbs().count("status") == 3:
            raise KeyboardInterrupt

    hosts["h0"].before = interrupt_on_third_poll
    with pytest.raises(KeyboardInterrupt):
        control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())
    assert journal.verbs()[-3:] == ["stop", "stop", "stop"]
    assert hosts["h0"].tasks["ps:0"].state is TaskState.STOPPED


def test_unreachable_peers_fail_the_start_naming_each_connection() -> None:
    cluster, hosts, _journal = make()
    hosts["h2"]._probe = lambda request: p.ProbeAnswer(  # type: ignore[method-assign]
        {t: p.ProbeResult(False, "timeout", "10.0.0.1") for t in request.targets}
    )
    with pytest.raises(StartupError) as raised:
        control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())
    assert "1 of 3 connections failed" in raised.value.message
    assert "h2 -> h0:2222: timed out: a firewall drops the traffic" in raised.value.message


# ---------------------------------------------------------------- supervise and decide


def rules(cluster: Cluster, host_patience: float, **more: Any) -> Rules[Any]:
    return Rules(cluster.record.decisive, cluster.record.essential, host_patience, **more)


def running(cluster: Cluster) -> Cluster:
    control.start(cluster, [Phase(cluster.record.tasks)], timeout=5, clock=FakeClock())
    return cluster


def test_supervise_succeeds_when_the_decisive_tasks_succeed() -> None:
    cluster, _hosts, _journal = make({"worker:0": TaskScript(end_after=3)})
    outcome = control.supervise(running(cluster), clock=FakeClock())
    assert outcome == Outcome(RunState.SUCCEEDED, "worker:0 finished successfully")


def test_all_workers_policy_waits_for_every_decisive_task() -> None:
    cluster, _hosts, journal = make(
        {"worker:0": TaskScript(end_after=2), "worker:1": TaskScript(end_after=6)}, decisive=("worker:0", "worker:1")
    )
    outcome = control.supervise(running(cluster), clock=FakeClock())
    assert outcome.succeeded and outcome.reason == "worker:0, worker:1 finished successfully"
    assert journal.verbs("h2").count("status") == 6


def test_an_essential_task_ending_fails_the_run_and_names_it() -> None:
    cluster, _hosts, _journal = make({"ps:0": TaskScript(end_after=2, signal=9)})
    outcome = control.supervise(running(cluster), clock=FakeClock())
    assert outcome == Outcome(
        RunState.FAILED,
        "ps:0 on h0 was killed by signal 9 (SIGKILL, maybe by the kernel's out-of-memory killer)",
        "ps:0",
    )


def test_a_failed_worker_fails_the_run_with_its_exit_code() -> None:
    cluster, _hosts, _journal = make({"worker:1": TaskScript(end_after=2, exit_code=137)})
    outcome = control.supervise(running(cluster), clock=FakeClock())
    assert outcome.state is RunState.FAILED and outcome.culprit == "worker:1"
    assert outcome.reason == "worker:1 on h2 exited with code 137"


def test_a_stopped_task_ends_the_run_as_stopped_not_failed() -> None:
    cluster, hosts, _journal = make()
    running(cluster)
    hosts["h2"].tasks["worker:1"] = p.TaskInfo("worker:1", TaskState.STOPPED)
    outcome = control.supervise(cluster, clock=FakeClock())
    assert outcome.state is RunState.STOPPED and outcome.reason == "worker:1 on h2 was stopped (tfctl down)"


def test_a_host_silent_past_its_patience_fails_the_run() -> None:
    cluster, hosts, _journal = make()
    running(cluster)
    hosts["h2"].down = True
    clock = FakeClock()
    outcome = control.supervise(cluster, rules(cluster, 25), clock=clock)
    assert outcome.state is RunState.FAILED and 25 <= clock.monotonic() - 1000.0 <= 27  # a look a second
    assert re.fullmatch(
        r"lost contact with h2 since \d\d:\d\d:\d\d \(25s, host_timeout\): h2: connection refused", outcome.reason
    ), outcome.reason


def test_a_host_back_within_its_patience_is_forgiven() -> None:
    cluster, hosts, journal = make({"worker:0": TaskScript(end_after=8)})
    running(cluster)

    def flap(request: p.Request[Any]) -> None:
        hosts["h2"].down = 2 <= journal.verbs("h2").count("status") <= 4

    hosts["h2"].before = flap
    done: list[Action] = []
    clock = FakeClock()
    began = clock.time()
    outcome = control.supervise(cluster, rules(cluster, 60), done.append, clock=clock)
    assert outcome.succeeded
    silent = [dict(a.since) for a in done if isinstance(a, NoteSilence)]
    assert [sorted(s) for s in silent] == [["h2"], []]  # told when it went silent and when it came back
    assert len(done) == 2  # and nothing else
    assert began <= silent[0]["h2"] <= clock.time()


def test_a_judge_decides_what_states_cannot_on_the_closer_look_every_judge_every_seconds() -> None:
    cluster, _hosts, journal = make()
    verdict = Outcome(RunState.FAILED, "worker:1 has been stuck", "worker:1")
    clock = FakeClock(start=0)
    calls: list[tuple[float, int]] = []

    def judge(sight: list[TaskStatus], now: float) -> Ruling:
        calls.append((now, len(sight)))
        return Ruling(verdict if len(calls) == 3 else None)

    def closer_look(wants: frozenset[Hashable]) -> tuple[list[TaskStatus], dict[str, Exception], object]:
        assert wants == frozenset()
        statuses, silent = cluster.status(tail=5)
        return statuses, silent, statuses

    judged = rules(cluster, 60, judges=[judge])
    assert control.supervise(running(cluster), judged, closer_look=closer_look, clock=clock) == verdict
    assert calls == [(0, 3), (5, 3), (10, 3)]  # on the first look, then every JUDGE_EVERY seconds
    assert journal.verbs("h2").count("status") == 11  # one look a second, the judges' among them


def test_what_a_judge_wants_comes_with_the_next_look_taken_at_once() -> None:
    cluster, _hosts, journal = make()
    clock = FakeClock(start=0)
    looks: list[tuple[float, frozenset[Hashable]]] = []

    def judge(sight: frozenset[Hashable], now: float) -> Ruling:
        if "counted" in sight:
            return Ruling(Outcome(RunState.FAILED, "said with the lines counted"))
        return Ruling(wants=frozenset({"counted"}) if now >= 5 else frozenset())

    def closer_look(wants: frozenset[Hashable]) -> tuple[list[TaskStatus], dict[str, Exception], object]:
        looks.append((clock.monotonic(), wants))
        statuses, silent = cluster.status(tail=5)
        return statuses, silent, wants

    outcome = control.supervise(
        running(cluster), rules(cluster, 60, judges=[judge]), closer_look=closer_look, clock=clock
    )
    assert outcome.reason == "said with the lines counted"
    assert looks == [(0, frozenset()), (5, frozenset()), (5, frozenset({"counted"}))]
    assert journal.verbs("h2").count("status") == 7  # 0..5 s, then the wanted look at once


def test_cancelling_supervision_returns_at_once() -> None:
    cluster, _hosts, _journal = make()
    cancel = Cancel()
    cancel.set("tfctl down")
    outcome = control.supervise(running(cluster), cancel=cancel, clock=FakeClock())
    assert outcome == Outcome(RunState.STOPPED, "tfctl down")


# ---------------------------------------------------------------- the controller over fake hosts


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "home")


def stored(store: RunStore, record: RunRecord) -> RunRecord:
    store.create(record)
    return record


def test_finish_stops_everything_and_records_the_outcomes_state(store: RunStore) -> None:
    for state in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED):
        cluster, hosts, _journal = make(run_id=f"run-{state.value}")
        stored(store, cluster.record)
        running(cluster)
        ending = driver.finish(store, cluster, Outcome(state, f"because {state.value}"))
        assert ending.record.state is state and ending.record.reason == f"because {state.value}"
        assert ending.record.ended_at is not None and not ending.record.active
        assert ending.stop.processes == 3 and ending.stop.clean
        assert all(t.state is TaskState.STOPPED for h in hosts.values() for t in h.tasks.values())
        assert store.load(cluster.record.run_id).state is state


def test_finish_reports_a_host_it_could_not_check(store: RunStore) -> None:
    cluster, hosts, _journal = make()
    stored(store, cluster.record)
    running(cluster)
    hosts["h1"].down = True
    ending = driver.finish(store, cluster, Outcome(RunState.SUCCEEDED, "done"))
    assert not ending.stop.clean and ending.stop.unreachable == {"h1": "h1: connection refused"}
    assert ending.stop.processes == 2


def with_fakes(monkeypatch: pytest.MonkeyPatch, hosts: dict[str, FakeHost]) -> None:
    """Make the controller's own Cluster(...) calls use these fake hosts."""
    for module in (up, launch, driver, down):
        monkeypatch.setattr(module, "Cluster", functools.partial(Cluster, agents=hosts))  # type: ignore[arg-type]


def test_ensure_no_live_run_refuses_a_second_run_of_a_live_cluster(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, hosts, _journal = make()
    stored(store, cluster.record.replace(state=RunState.RUNNING))  # as its controller recorded it once started
    running(cluster)
    with_fakes(monkeypatch, hosts)
    config = type("Config", (), {"path": Path(cluster.record.cluster_file), "name": "fake", "trial": None})()
    with pytest.raises(UsageError, match=r"run fake-run of cluster 'fake' is still running \(3 tasks"):
        up.ensure_no_live_run(store, config)
    hosts["h2"].down = True  # unknown counts as alive: the tasks may well be running
    with pytest.raises(UsageError, match="still running"):
        up.ensure_no_live_run(store, config)
    cluster.stop()
    hosts["h2"].down = False
    hosts["h2"].tasks["worker:1"] = p.TaskInfo("worker:1", TaskState.STOPPED)
    up.ensure_no_live_run(store, config)
    assert all(h.closed for h in hosts.values())


def finished_run(
    store: RunStore, monkeypatch: pytest.MonkeyPatch, unreachable: tuple[str, ...] = ()
) -> tuple[RunRecord, dict[str, FakeHost], Any]:
    """A run of fake hosts that succeeded and was stopped while `unreachable` were down; its
    record, its hosts, and the config of its cluster file, for `ensure_no_live_run`."""
    cluster, hosts, _journal = make()
    stored(store, cluster.record)
    running(cluster)
    with_fakes(monkeypatch, hosts)
    for name in unreachable:
        hosts[name].down = True
    driver.finish(store, cluster, Outcome(RunState.SUCCEEDED, "done"))
    config = type("Config", (), {"path": Path(cluster.record.cluster_file), "name": "fake", "trial": None})()
    return store.load(cluster.record.run_id), hosts, config


def test_up_after_a_run_whose_stop_left_nothing_asks_no_host(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    record, hosts, config = finished_run(store, monkeypatch)
    assert record.left_nothing
    for host in hosts.values():
        host.down = True  # asking any of them now would count its tasks as alive
    up.ensure_no_live_run(store, config)


def test_up_after_a_stop_that_missed_a_host_asks_the_hosts_again(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record, _hosts, config = finished_run(store, monkeypatch, unreachable=("h1",))
    assert not record.active and not record.left_nothing
    with pytest.raises(UsageError, match="still running"):
        up.ensure_no_live_run(store, config)


def test_down_records_the_run_as_stopped_and_reports_each_host(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, hosts, _journal = make()
    record = stored(store, cluster.record)
    running(cluster)
    with_fakes(monkeypatch, hosts)
    report, allocation_end = down.down(store, record, grace=0.5)
    assert allocation_end is None
    assert report.processes == 3 and report.clean and report.ports == [2222, 2223, 2224]
    after = store.load(record.run_id)
    assert after.state is RunState.STOPPED and after.reason == "tfctl down"


def test_status_with_its_diagnosis_is_one_request_per_host() -> None:
    """What `status` shows (states, progress, the diagnosis from each task's tail) in one round
    trip per host: a second `tail` call would double what status costs on every host."""
    from tfctl.controller.views.status_view import snapshot

    waiting = "CreateSession still waiting for response from worker: /job:ps/replica:0/task:0"
    cluster, _hosts, journal = make({"worker:1": TaskScript(lines=[waiting])})
    control.start(cluster, ps_first(cluster), timeout=5, clock=FakeClock())
    journal.entries.clear()
    shot = snapshot(cluster)
    verbs = [verb for _host, verb, _ in journal.entries]
    assert verbs.count("status") == 3 and "tail" not in verbs  # (a reachability probe explains the wait)
    assert "worker:1" in shot.diagnosis.findings
    assert shot.diagnosis.last_lines["worker:1"] == waiting
