"""Spare hosts: a lost host's tasks start on a spare (`controller/live/spares.py`), the tasks whose
cluster names the moved address restart with it (`tf/moves.py`), and with no spare left the run
fails as it always did. Driven in-process on the fake backend with a tiny `host_timeout`."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from tests.fake_runs import started, write
from tests.fakes import TaskScript
from tfctl.cli.render import render_stop, stop_summary
from tfctl.cluster.cluster import Cluster
from tfctl.config.loader import load_config
from tfctl.controller.live import driver
from tfctl.controller.live.stopping import stop_run
from tfctl.errors import ConfigError
from tfctl.runs.record import TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor import protocol as p
from tfctl.supervisor.protocol import RunState
from tfctl.tf.moves import peers_to_restart, readdressed

BETWEEN_GRAPH = """\
name: fake
backend: fake
fake: {pool: gpus, spares: [h3, h4]}
host_timeout: 0.05
command: train --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} --worker_hosts={worker_hosts}
jobs:
"""


def run(
    tmp_path,
    fake_backend,
    monkeypatch,
    jobs: str,
    goes_down: list[str],
    header: str = BETWEEN_GRAPH,
    on_lines: Callable[[list[tuple[str, str]]], None] = lambda _lines: None,
) -> Any:
    """Start the run attached, take the `goes_down` hosts down one after the other once each has
    answered a few looks, and supervise it to its end."""
    store, cluster = started(write(tmp_path, header + jobs), attached=True)

    def down_after_three(host: str) -> Any:
        def before(request: p.Request[Any]) -> None:
            if request.VERB == "status" and fake_backend.journal.verbs(host).count("status") > 3:
                fake_backend.hosts[host].down = True
                if goes_down:
                    nxt = goes_down.pop(0)
                    fake_backend.agent(nxt).before = down_after_three(nxt)

        return before

    if goes_down:
        first = goes_down.pop(0)
        fake_backend.hosts[first].before = down_after_three(first)
    with cluster:
        ending = driver.attach(store, cluster, on_lines)
    assert cluster.record == store.load(cluster.record.run_id)  # moves, retired hosts: memory and store stay one
    return store, ending


def tf_config(launch: p.TaskLaunch) -> dict[str, Any]:
    return json.loads(launch.env["TF_CONFIG"])["cluster"]


def test_a_lost_between_graph_worker_moves_to_a_spare_the_ps_and_chief_restart_and_the_run_succeeds(
    tmp_path, fake_backend, monkeypatch
):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=40)
    fake_backend.scripts["worker:1"] = TaskScript(after_restart=None)
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n", ["h2"])
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    record = ending.record
    assert record.task("worker:1").address == "h3:2222" and record.spares == ("h4",)
    [move] = record.moves
    assert (move.task, move.from_host, move.to_host, move.restarted) == ("worker:1", "h2", "h3", ("ps:0", "worker:0"))
    assert move.why.startswith("lost contact with h2 since ")
    launch = fake_backend.hosts["h3"].launches["worker:1"]
    assert tf_config(launch) == {"ps": ["h1:2222"], "worker": ["h1:2223", "h3:2222"]}
    assert "--worker_hosts=h1:2223,h3:2222" in launch.command
    h1 = fake_backend.hosts["h1"]
    assert fake_backend.journal.verbs("h1").count("start") == 2  # started, then again with worker 1's new address
    for name in ("ps:0", "worker:0"):
        assert tf_config(h1.launches[name])["worker"] == ["h1:2223", "h3:2222"]
    assert store.load(record.run_id).moves == record.moves
    assert [h.name for h in record.hosts] == ["h1", "h3", "h4"]  # h2 left the run, but stays on its record
    assert [h.name for h in store.load(record.run_id).lost_hosts] == ["h2"]  # ... as it never answered again
    assert ending.stop.clean and list(ending.stop.lost_silent) == ["h2"]  # asked, silent: not unclean
    assert "info" in fake_backend.journal.verbs("h4") and "start" not in fake_backend.journal.verbs(
        "h4"
    )  # checked, idle


def test_an_attached_up_streams_the_moved_task_and_those_restarted_with_it_from_their_new_start(
    tmp_path, fake_backend, monkeypatch
):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=40)
    header = BETWEEN_GRAPH.replace("command: train", "command: echo {job_name}{task_index} sees")
    lines: list[tuple[str, str]] = []
    jobs = "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n"
    _, ending = run(tmp_path, fake_backend, monkeypatch, jobs, ["h2"], header=header, on_lines=lines.extend)
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    after = "--ps_hosts=h1:2222 --worker_hosts=h1:2223,h3:2222"
    assert (
        ("ps:0", f"ps0 sees --job_name=ps --task_index=0 {after}") in lines
        and ("worker:0", f"worker0 sees --job_name=worker --task_index=0 {after}") in lines
        and ("worker:1", f"worker1 sees --job_name=worker --task_index=1 {after}") in lines
    ), lines
    before = "--ps_hosts=h1:2222 --worker_hosts=h1:2223,h2:2222"
    for task, line in (
        ("ps:0", f"ps0 sees --job_name=ps --task_index=0 {before}"),
        ("worker:0", f"worker0 sees --job_name=worker --task_index=0 {before}"),
    ):
        assert lines.count((task, line)) == 1, lines  # their first life's lines, each once
    assert len(lines) == len(set(lines)), lines  # nothing read twice


def test_a_lost_host_that_comes_back_is_made_to_stop_the_tasks_it_still_ran(tmp_path, fake_backend, monkeypatch):
    """A frozen host thaws with its tasks running, their moved selves already training: the
    controller stops them there (it renews no lease there any more), and strikes the host off."""
    fake_backend.scripts["worker:0"] = TaskScript(end_after=200)
    h2 = fake_backend.agent("h2")

    def thaw_h2_later(request: p.Request[Any]) -> None:
        if request.VERB == "status" and fake_backend.journal.verbs("h3").count("status") == 20:
            h2.down = False

    fake_backend.agent("h3").before = thaw_h2_later
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n", ["h2"])
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    assert h2.tasks["worker:1"].state is p.TaskState.STOPPED  # the old worker:1, stopped on h2 ...
    entries = fake_backend.journal.entries
    h2_stopped = next(i for i, (h, verb, _) in enumerate(entries) if (h, verb) == ("h2", "stop"))
    run_stopped = max(i for i, (h, verb, _) in enumerate(entries) if (h, verb) == ("h1", "stop"))
    assert h2_stopped < run_stopped  # while the run went on, not by its final stop
    assert store.load(ending.record.run_id).lost_hosts == ()  # ... which the record no longer lists
    assert ending.stop.lost_silent == {} and ending.stop.clean


def test_down_of_a_run_whose_lost_host_is_still_silent_is_clean_and_says_so(
    tmp_path, fake_backend, monkeypatch, capsys
):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=40)
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n", ["h2"])
    report = stop_summary(ending.stop)
    assert "2 processes stopped on 3 hosts; 0 remain" in report, report
    capsys.readouterr()
    render_stop(ending.stop)
    said = capsys.readouterr().err
    assert "h2, which the run left when its tasks moved to a spare, is still silent" in said, said
    assert "`tfctl down` again stops them" in said, said
    run_id = ending.record.run_id
    assert not store.load(run_id).left_nothing  # what h2 ran may come back: the next `up` asks the hosts
    fake_backend.hosts["h2"].down = False  # back, its tasks with it: the next `down` stops them there
    with Cluster(store.load(run_id)) as cluster:
        again, _ = stop_run(store, cluster)
    assert again.processes == 1 and again.lost_silent == {} and again.clean
    assert fake_backend.hosts["h2"].tasks["worker:1"].state is p.TaskState.STOPPED
    assert store.load(run_id).lost_hosts == () and store.load(run_id).left_nothing


def test_a_returning_host_whose_processes_survive_the_stop_stays_lost_until_they_are_gone(
    tmp_path, fake_backend, monkeypatch
):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=300)
    h2 = fake_backend.agent("h2")
    h2.survivors = [4242]  # in D state on a hung NFS mount, say
    lost_meanwhile: list[list[str]] = []

    def thaw_then_free(request: p.Request[Any]) -> None:
        looks = fake_backend.journal.verbs("h3").count("status")
        if request.VERB == "status" and looks == 20:
            h2.down = False
        if isinstance(request, p.StatusRequest) and looks == 100:
            lost_meanwhile.append([h.name for h in RunStore().load(request.run_id).lost_hosts])
            h2.survivors = []

    fake_backend.agent("h3").before = thaw_then_free
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n", ["h2"])
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    assert lost_meanwhile == [["h2"]]  # answering, but with a survivor: still lost
    assert store.load(ending.record.run_id).lost_hosts == ()  # struck off once nothing survived
    assert fake_backend.journal.verbs("h2").count("stop") >= 2


def test_a_host_struck_off_while_another_moves_stays_off(tmp_path, fake_backend, monkeypatch):
    """h2 is lost, comes back and is struck off; then h3, the spare running its task, is lost in
    turn: the second move must not bring h2 back from the controller's older copy of the record."""
    fake_backend.scripts["worker:0"] = TaskScript(end_after=400)
    h2, h3 = fake_backend.agent("h2"), fake_backend.agent("h3")
    looks_after_h2_stopped: list[int] = []

    def thaw_h2_then_lose_h3(request: p.Request[Any]) -> None:
        if request.VERB != "status":
            return
        if fake_backend.journal.verbs("h3").count("status") == 10:
            h2.down = False
        if "stop" in fake_backend.journal.verbs("h2"):
            looks_after_h2_stopped.append(1)
            if len(looks_after_h2_stopped) == 20:
                h3.down = True

    lost_after_the_second_move: list[list[str]] = []

    def look_once_moved(request: p.Request[Any]) -> None:
        if isinstance(request, p.StatusRequest) and fake_backend.journal.verbs("h4").count("status") == 3:
            lost_after_the_second_move.append([h.name for h in RunStore().load(request.run_id).lost_hosts])

    h3.before = thaw_h2_then_lose_h3
    fake_backend.agent("h4").before = look_once_moved
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n", ["h2"])
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    assert [(m.from_host, m.to_host) for m in ending.record.moves] == [("h2", "h3"), ("h3", "h4")]
    assert lost_after_the_second_move == [["h3"]]  # (the run's last stop would hide a wrong list: it asks h2)


def test_a_spare_silent_when_its_turn_comes_is_lost_in_its_turn_and_the_next_spare_takes_the_tasks(
    tmp_path, fake_backend, monkeypatch
):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=60)
    h2, h3 = fake_backend.agent("h2"), fake_backend.agent("h3")

    def h2_and_h3_go_down(request: p.Request[Any]) -> None:
        if request.VERB == "status" and fake_backend.journal.verbs("h2").count("status") > 3:
            h2.down = h3.down = True

    h2.before = h2_and_h3_go_down
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n", [])
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    record = ending.record
    assert [(m.task, m.from_host, m.to_host) for m in record.moves] == [
        ("worker:1", "h2", "h3"),
        ("worker:1", "h3", "h4"),
    ]
    assert record.moves[1].why.startswith("spare h3 failed: ") and record.moves[1].restarted == ("ps:0", "worker:0")
    assert record.task("worker:1").address == "h4:2222" and record.spares == ()
    assert tf_config(fake_backend.hosts["h1"].launches["worker:0"])["worker"] == ["h1:2223", "h4:2222"]
    assert [h.name for h in store.load(record.run_id).lost_hosts] == ["h2", "h3"]


def test_a_lost_ps_moves_and_every_worker_restarts_with_its_new_address(tmp_path, fake_backend, monkeypatch):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=40)
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  ps: [h2:2222]\n  worker: [h1:2223, h1:2224]\n", ["h2"])
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    [move] = ending.record.moves
    assert (move.task, move.to_host, move.restarted) == ("ps:0", "h3", ("worker:0", "worker:1"))
    h1 = fake_backend.hosts["h1"]
    assert fake_backend.journal.verbs("h1").count("start") == 2  # started, then again for the move
    for name in ("worker:0", "worker:1"):
        assert tf_config(h1.launches[name])["ps"] == ["h3:2222"]
        assert "--ps_hosts=h3:2222" in h1.launches[name].command
    assert ending.record.task("worker:1").env["TF_CONFIG"] == h1.launches["worker:1"].env["TF_CONFIG"]


def test_with_no_spare_left_a_lost_host_fails_the_run_as_before(tmp_path, fake_backend, monkeypatch):
    jobs = "  ps: [h1:2222]\n  worker: [h1:2223, h2:2222]\n"
    store, ending = run(tmp_path, fake_backend, monkeypatch, jobs, ["h2", "h3", "h4"])
    assert ending.outcome.state is RunState.FAILED
    assert ending.outcome.reason.startswith("lost contact with h4 since "), ending.outcome.reason
    assert [(m.from_host, m.to_host) for m in ending.record.moves] == [("h2", "h3"), ("h3", "h4")]
    assert ending.record.spares == () and ending.record.task("worker:1").host == "h4"


PATIENT = BETWEEN_GRAPH.replace("host_timeout: 0.05", "host_timeout: 20")  # 20 of the lab's looks: a peer fails first


def fails_soon_then_runs_well_once_restarted(fake_backend, name: str, then: TaskScript) -> None:
    """`name` (on h1) fails two looks after h2 went silent, as an all-reduce peer does on
    UNAVAILABLE; started again anywhere, it lives `then`."""
    fake_backend.scripts[name] = TaskScript(end_after=6, exit_code=1)

    def healed(request: p.Request[Any]) -> None:
        if request.VERB == "start":
            fake_backend.scripts[name] = then

    fake_backend.agent("h3").before = healed


def test_a_peer_failing_while_a_host_is_silent_waits_for_its_verdict_and_starts_again_with_the_move(
    tmp_path, fake_backend, monkeypatch
):
    fails_soon_then_runs_well_once_restarted(fake_backend, "worker:0", TaskScript(end_after=40))
    jobs = "  worker: [h1:2222, h2:2222]\n"  # one collective group
    store, ending = run(tmp_path, fake_backend, monkeypatch, jobs, ["h2"], header=PATIENT)
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    [move] = ending.record.moves
    assert (move.task, move.from_host, move.to_host, move.restarted) == ("worker:1", "h2", "h3", ("worker:0",))
    assert move.why.startswith("lost contact with h2 since ")
    assert fake_backend.journal.verbs("h1").count("start") == 2


def test_a_task_failing_while_a_host_is_silent_starts_again_with_the_move_though_it_talks_to_no_moved_task(
    tmp_path, fake_backend, monkeypatch, capsys
):
    fails_soon_then_runs_well_once_restarted(fake_backend, "ps:0", TaskScript())
    fake_backend.scripts["worker:0"] = TaskScript(end_after=60)
    jobs = "  ps: [h1:2222, h2:2222]\n  worker: [h1:2223]\n"  # ps 1 moves; ps 0 talks to no ps
    store, ending = run(tmp_path, fake_backend, monkeypatch, jobs, ["h2"], header=PATIENT)
    assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome.reason
    [move] = ending.record.moves
    assert (move.task, move.restarted) == ("ps:1", ("ps:0", "worker:0"))
    said = capsys.readouterr().err
    assert "ps:0 ended while h2 was silent: starting again with the move" in said, said
    assert "restarting worker:0: their cluster names the new address" in said, said


def test_a_failure_while_a_host_is_silent_fails_the_run_at_once_with_no_spare(tmp_path, fake_backend, monkeypatch):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=6, exit_code=1)
    header = PATIENT.replace(", spares: [h3, h4]", "")
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  worker: [h1:2222, h2:2222]\n", ["h2"], header=header)
    assert ending.outcome.state is RunState.FAILED
    assert ending.outcome.reason == "worker:0 on h1 exited with code 1", ending.outcome.reason
    assert "status" not in fake_backend.journal.verbs("h3")


def test_a_failure_while_a_host_is_silent_stands_once_the_host_answers_again(tmp_path, fake_backend, monkeypatch):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=6, exit_code=1)
    h2 = fake_backend.agent("h2")

    def thaw_h2_soon(request: p.Request[Any]) -> None:
        worker0 = fake_backend.hosts["h1"].tasks.get("worker:0")
        if request.VERB == "status" and worker0 and worker0.state is p.TaskState.FAILED:
            h2.down, h2.before = False, None  # (its hook would take it down again)

    fake_backend.agent("h1").before = thaw_h2_soon
    store, ending = run(tmp_path, fake_backend, monkeypatch, "  worker: [h1:2222, h2:2222]\n", ["h2"], header=PATIENT)
    assert ending.outcome.state is RunState.FAILED
    assert ending.outcome.reason == "worker:0 on h1 exited with code 1", ending.outcome.reason
    assert ending.record.moves == ()


def task(job: str, index: int, host: str, port: int = 2222) -> TaskSpec:
    return TaskSpec(job, index, host, port, "train", {}, None)


@pytest.mark.parametrize(
    ("jobs", "moved", "restarted"),
    [
        ("ps worker worker", "worker:1", ["ps:0", "worker:0"]),  # the ps pulls gradients from it
        ("ps worker worker", "ps:0", ["worker:0", "worker:1"]),
        ("ps ps worker", "ps:1", ["worker:0"]),  # the other ps talks to no ps
        ("worker worker worker", "worker:2", ["worker:0", "worker:1"]),  # one collective group
        ("chief worker worker", "worker:0", ["chief:0", "worker:1"]),  # MWMS with a chief
        ("chief ps worker worker", "worker:1", ["chief:0", "ps:0", "worker:0"]),
        ("ps worker evaluator", "evaluator:0", []),
    ],
)
def test_which_tasks_restart_when_one_moves(jobs, moved, restarted):
    tasks: list[TaskSpec] = []
    counts: dict[str, int] = {}
    for n, job in enumerate(jobs.split()):
        tasks.append(task(job, counts.setdefault(job, 0), f"h{n}"))
        counts[job] += 1
    assert peers_to_restart(tasks, moved) == restarted


def test_readdressing_touches_whole_addresses_only():
    tf = json.dumps({"cluster": {"ps": ["h1:2222"], "worker": ["h1:22220", "xh1:2222"]}, "task": {"type": "ps"}})
    spec = TaskSpec(
        "ps", 0, "h1", 2222, "t --ps_hosts=h1:2222 --w=h1:22220,xh1:2222", {"TF_CONFIG": tf, "A": "h1:2222"}, None
    )
    out = readdressed(spec, {"h1:2222": "h9:2222"})
    assert out.command == "t --ps_hosts=h9:2222 --w=h1:22220,xh1:2222" and out.env["A"] == "h9:2222"
    assert json.loads(out.env["TF_CONFIG"])["cluster"] == {"ps": ["h9:2222"], "worker": ["h1:22220", "xh1:2222"]}


SSH_FILE = "name: s\ncommand: train\njobs:\n  ps: [h1:2222]\n  worker: [h2:2222]\n"


def test_spares_are_ssh_hosts_no_job_uses_and_other_backends_refuse_them(tmp_path):
    config = load_config(write(tmp_path, SSH_FILE + "spares: [h3]\nhosts:\n  h3: {python: /opt/py}\n"))
    assert config.backend_settings.spares == ("h3",)
    for extra, problem in [
        ("spares: [h2]\n", "h2 runs tasks already"),
        ("spares: [h3:2222]\n", "is not a host name"),
        ("spares: [h3, h3]\n", "listed twice"),
        ("backend: slurm\nspares: [h3]\n", "is for the ssh backend"),
    ]:
        text = SSH_FILE + extra
        if "slurm" in extra:
            text = (
                "name: s\ncommand: train\njobs:\n  ps: {count: 1, port: 2222}\n  worker: {count: 1, port: 2222}\n"
                + extra
            )
        with pytest.raises(ConfigError, match=problem):
            load_config(write(tmp_path, text))
