"""Backends as peers: every backend implements one interface, and generic code reaches them only
through it. The tests' fake backend (tests/fake_backend) runs the whole lifecycle in-process."""

from __future__ import annotations

import inspect

import pytest

from tests.fake_runs import FAKE_FILE, write
from tests.fakes import TaskScript
from tfctl.backends.base import Backend, backend_for
from tfctl.config.loader import load_config
from tfctl.controller.live import driver, launch
from tfctl.controller.live.watcher import controller_of_this_process
from tfctl.controller.verbs import down, forget, up
from tfctl.engine.clock import Cancel
from tfctl.errors import BackendError, ConfigError
from tfctl.runs.record import ControllerKind
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState, TaskState


def interface_methods() -> set[str]:
    return {name for name in vars(Backend) if not name.startswith("_")} - {"name"}


@pytest.mark.parametrize("name", ["ssh", "slurm", "fake"])
def test_every_backend_implements_the_whole_interface_and_nothing_more_in_public(name, fake_backend):
    backend = backend_for(name)
    wanted = {n for n in inspect.get_annotations(Backend)} | interface_methods()
    public = {n for n in dir(backend) if not n.startswith("_")} - {"run"}  # slurm's injected runner
    assert wanted <= public, f"{name} lacks {sorted(wanted - public)}"
    assert public <= wanted, f"{name} has public extras {sorted(public - wanted)}: add them to Backend or hide them"
    for method in interface_methods():
        ours = inspect.signature(getattr(type(backend), method))
        theirs = inspect.signature(getattr(Backend, method))
        assert list(ours.parameters) == list(theirs.parameters), f"{name}.{method}{ours} != Backend.{method}{theirs}"


def test_a_registered_backend_brings_its_own_section_and_refuses_another_backends(tmp_path, fake_backend):
    config = load_config(write(tmp_path))
    assert config.backend == "fake" and config.backend_settings.pool == "gpus"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, FAKE_FILE.replace("backend: fake\n", "")))
    assert "fake: is set, but the backend is not fake" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, FAKE_FILE.replace("backend: fake", "backend: fakes")))
    assert "fake" in str(caught.value) and "ssh" in str(caught.value) and "slurm" in str(caught.value)


def test_detached_lifecycle_acquires_runs_watches_stops_releases_and_prunes(tmp_path, fake_backend):
    store = RunStore()
    config = load_config(write(tmp_path))
    fake_backend.scripts["worker:0"] = TaskScript(end_after=4)
    fake_backend.scripts["worker:1"] = TaskScript(end_after=3)
    said: list[tuple[str, str]] = []
    plan = up.acquire(store, config, lambda who, what: said.append((who, what)))
    assert ("fake", "leased pool gpus") in said and fake_backend.leases == {plan.record.run_id: "gpus"}
    assert plan.record.backend == "fake" and plan.record.backend_state == {"pool": "gpus"}
    watcher = controller_of_this_process(ControllerKind.WATCHER)
    cluster = launch.launch(store, plan, lambda *_: None, detach=True, watcher=watcher)
    assert store.load(plan.record.run_id).state is RunState.RUNNING
    with cluster:
        ending = driver._watch(store, cluster, Cancel())
    assert ending is not None and ending.outcome.state is RunState.SUCCEEDED, ending
    assert ending.stop.clean and fake_backend.released == [plan.record.run_id]
    assert fake_backend.hosts["h1"].tasks["ps:0"].state is TaskState.STOPPED  # the ps stopped with the run
    record = store.load(plan.record.run_id)
    assert record.state is RunState.SUCCEEDED and record.left_nothing
    report = forget.prune(store, [record], dry_run=True)
    assert report.runs[0].complete and not report.unreachable


def test_the_backend_ending_a_run_fails_it_and_down_releases_once(tmp_path, fake_backend):
    store = RunStore()
    plan = up.acquire(store, load_config(write(tmp_path)), lambda *_: None)
    cluster = launch.launch(store, plan, lambda *_: None, detach=True)
    fake_backend.end_run(plan.record.run_id)
    with cluster:
        ending = driver._watch(store, cluster, Cancel())
    assert ending is not None and ending.outcome.reason == f"the fake pool ended run {plan.record.run_id}"
    assert store.load(plan.record.run_id).state is RunState.FAILED
    report, released = down.down(store, store.load(plan.record.run_id), grace=0)
    assert released is None and fake_backend.released == [plan.record.run_id]  # released once, by the run's end
    assert report.clean


def test_a_backend_that_cannot_acquire_leaves_nothing_and_says_why(tmp_path, fake_backend):
    fake_backend.refuse = "the pool is drained"
    with pytest.raises(BackendError, match="drained"):
        up.acquire(RunStore(), load_config(write(tmp_path)), lambda *_: None)
    assert not fake_backend.hosts and not RunStore().all()
