"""`tfctl up --resume`: a new run finds an earlier run's files (checkpoints) in its own
$TFCTL_RUN_DIR, on every host, once per shared home, and the earlier run keeps its files as they were."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from tests.conftest import fake, free_ports, tfctl
from tests.fake_runs import started, tfctl_here, write
from tests.test_ssh_cluster import OWN, SHARED, distinct_roots, run_pids, write_cluster
from tfctl.config.loader import load_config
from tfctl.controller.live import launch
from tfctl.controller.verbs import down, up
from tfctl.errors import UsageError
from tfctl.runs.store import RunStore
from tfctl.supervisor import resume
from tfctl.supervisor.files import work_dir
from tfctl.supervisor.protocol import ResumeRequest

# ---------------------------------------------------------------- on the host


def test_a_host_brings_every_file_the_new_run_lacks_linking_big_ones_and_copying_small_ones(tmp_path):
    root = str(tmp_path / "root")
    old, new = work_dir(root, "r1"), work_dir(root, "r2")
    os.makedirs(os.path.join(old, "checkpoints", "deep"))
    big = os.path.join(old, "checkpoints", "ckpt-9.data-00000-of-00001")
    Path(big).write_bytes(b"w" * resume.LINK_FROM)
    Path(old, "checkpoints", "checkpoint").write_text('model_checkpoint_path: "ckpt-9"\n')
    Path(old, "checkpoints", "deep", "events").write_text("e")
    Path(old, "train.py").write_text("old code")
    os.makedirs(new)
    Path(new, "train.py").write_text("new code")  # synced by the new run: it wins

    answer = resume.resume(root, ResumeRequest("r2", "r1"))

    assert (answer.found, answer.linked, answer.copied) == (True, 1, 2)
    assert Path(new, "train.py").read_text() == "new code"
    assert os.path.samefile(big, os.path.join(new, "checkpoints", "ckpt-9.data-00000-of-00001"))
    index = Path(new, "checkpoints", "checkpoint")
    assert not os.path.samefile(index, Path(old, "checkpoints", "checkpoint"))  # a rewrite stays in r2
    index.write_text('model_checkpoint_path: "ckpt-12"\n')
    assert Path(old, "checkpoints", "checkpoint").read_text() == 'model_checkpoint_path: "ckpt-9"\n'
    assert Path(new, "checkpoints", "deep", "events").read_text() == "e"
    assert resume.resume(root, ResumeRequest("r2", "r1")) == answer  # a replay, or a host on the same home


def test_a_host_without_the_earlier_runs_files_says_so(tmp_path):
    answer = resume.resume(str(tmp_path), ResumeRequest("r2", "pruned"))
    assert not answer.found and answer.linked == answer.copied == 0


# ---------------------------------------------------------------- the controller's choices


def test_resume_continues_the_files_newest_run_once_per_filesystem_and_records_it(tmp_path, fake_backend):
    path = write(tmp_path)
    store, cluster = started(path)
    first = cluster.record.run_id
    down.down(store, store.load(first), None)
    for host, count in (("h1", 4), ("h2", 0)):
        fake_backend.agent(host).resumable = {first: count} if count else {}
    fake_backend.agent("h2").filesystem = "fs-h2"
    fake_backend.journal.entries.clear()
    said: list[tuple[str, str]] = []
    config = load_config(path)
    run = up.acquire(store, config, lambda *_: None, up.resumed_run(store, config, ""))
    cluster = launch.launch(store, run, lambda who, what: said.append((who, what)), detach=True)
    second = cluster.record.run_id
    assert store.load(second).resumes == first
    assert ("h1", f"resumes run {first}: 4 files of it now in ~/.tfctl/work/{second}") in said
    assert ("h2", f"nothing of run {first} here (pruned, or it never ran here): its tasks start afresh") in said
    resumes = [e for e in fake_backend.journal.entries if e[1] == "resume"]
    assert sorted(h for h, _, _ in resumes) == ["h1", "h2"]
    assert fake_backend.journal.index("resume") < fake_backend.journal.index("start")  # files first
    status = json.loads(tfctl_here("-f", str(path), "status", "--json").out)
    assert status["run"]["resumes"] == first
    runs = tfctl_here("-f", str(path), "runs")
    assert f"(resumes {first})" in runs.out
    down.down(store, store.load(second), None)


def test_hosts_sharing_a_home_resume_once(tmp_path, fake_backend):
    path = write(tmp_path)
    store, cluster = started(path)
    first = cluster.record.run_id
    down.down(store, store.load(first), None)
    for host in ("h1", "h2"):
        fake_backend.agent(host).filesystem = "nfs"
        fake_backend.agent(host).resumable = {first: 2}
    fake_backend.journal.entries.clear()
    said: list[tuple[str, str]] = []
    config = load_config(path)
    run = up.acquire(store, config, lambda *_: None, up.resumed_run(store, config, first))
    cluster = launch.launch(store, run, lambda who, what: said.append((who, what)), detach=True)
    assert [h for h, verb, _ in fake_backend.journal.entries if verb == "resume"] == ["h1"]
    assert ("h2", "shares its home directory with h1: resumed there, once") in said
    down.down(store, store.load(cluster.record.run_id), None)


def test_resume_is_refused_with_no_earlier_run_a_run_of_another_file_or_a_live_one(tmp_path, fake_backend):
    path = write(tmp_path)
    store = RunStore()
    with pytest.raises(UsageError, match="no earlier run of .* to resume"):
        up.resumed_run(store, load_config(path), "")
    other = tmp_path / "other"
    other.mkdir()
    store, cluster = started(write(other))
    with pytest.raises(UsageError, match=f"run {cluster.record.run_id} is a run of .*other/cluster.yaml"):
        up.resumed_run(store, load_config(path), cluster.record.run_id)
    with pytest.raises(UsageError, match="is still running"):
        up.resumed_run(store, load_config(other / "cluster.yaml"), "")
    refused = tfctl_here("-f", str(path), "up", "--resume", "no-such-run")
    assert refused.code == 2 and "no run 'no-such-run'" in refused.err and "Traceback" not in refused.err
    down.down(store, store.load(cluster.record.run_id), None)


def test_resuming_a_live_run_hints_the_down_of_the_file_the_user_typed(tmp_path, fake_backend, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _store, cluster = started(write(tmp_path).rename(tmp_path / "long.yaml"))
    cluster.close()
    refused = tfctl_here("-f", "long.yaml", "up", "--resume")
    assert refused.code == 2, refused.err
    assert f"hint: stop it first: tfctl -f long.yaml down --run {cluster.record.run_id}\n" in refused.err
    assert tfctl_here("-f", "long.yaml", "down").code == 0


# ---------------------------------------------------------------- end to end, on this machine


def test_a_resumed_local_run_counts_on_from_the_earlier_runs_checkpoint_which_stays_as_it_was(
    tmp_path: Path, home: Path
) -> None:
    port = free_ports(1)[0]
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"name: r\ngrace_period: 2\njobs:\n  worker:\n    hosts: [localhost:{port}]\n"
        f'    command: "{fake("--name w --lines 3 --checkpoint")}"\n'
    )
    first = tfctl("-f", str(path), "up", home=home)
    assert first.returncode == 0, first.stderr
    assert "w checkpoint step 3" in first.stdout and "resumed" not in first.stdout
    second = tfctl("-f", str(path), "up", "--resume", home=home)
    assert second.returncode == 0, second.stderr
    runs = json.loads(tfctl("-f", str(path), "runs", "--json", home=home).stdout)
    assert [r["resumes"] for r in runs] == [None, runs[0]["run_id"]]
    assert f", resuming run {runs[0]['run_id']}" in second.stderr
    assert "w resumed at step 3" in second.stdout and "w checkpoint step 6" in second.stdout
    saved = home / "work" / runs[0]["run_id"] / "checkpoints" / "w"
    assert saved.read_text() == "3"  # the earlier run's checkpoint is as that run left it
    assert (home / "work" / runs[1]["run_id"] / "checkpoints" / "w").read_text() == "6"


# ---------------------------------------------------------------- on ssh hosts, own and shared homes


@pytest.fixture(scope="module", params=[OWN, SHARED], ids=["own-home", "shared-home"])
def lab(request, tmp_path_factory):
    """2 hosts tfh0, tfh1, each with its own home or sharing one."""
    require_netns()
    with TestHostLab(
        2,
        workdir=tmp_path_factory.mktemp("resume-lab"),
        prefix="tfctl-rs",
        bridge="tfctlbr52",
        subnet="10.77.52",
        shared_home=request.param == SHARED,
    ) as lab:
        yield lab


def test_a_resumed_run_on_ssh_hosts_counts_on_from_each_tasks_checkpoint(tmp_path, home, lab):
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --lines 2 --sleep 0 --checkpoint"
    cluster = write_cluster(tmp_path, lab, "  worker: [tfh0:2222, tfh1:2222]", command)
    first = tfctl("-f", str(cluster), "up", home=home)
    assert first.returncode == 0, first.stderr
    second = tfctl("-f", str(cluster), "up", "--resume", home=home)
    assert second.returncode == 0, second.stderr
    runs = [r["run_id"] for r in json.loads(tfctl("-f", str(cluster), "runs", "--json", home=home).stdout)]
    for task in ("worker0", "worker1"):
        assert f"{task} resumed at step 2" in second.stdout and f"{task} checkpoint step 4" in second.stdout
    if lab.home_mode == SHARED:
        assert "shares its home directory with tfh0: resumed there, once" in second.stderr
    for root in distinct_roots(lab):
        kept = sorted(p.name for p in (root / "work" / runs[0] / "checkpoints").iterdir())
        assert {name: (root / "work" / runs[0] / "checkpoints" / name).read_text() for name in kept} == {
            name: "2" for name in kept
        }  # the earlier run's checkpoints as it left them
    assert run_pids(lab, runs[1]) == {}
