"""`tfctl runs`: which runs it lists, by cluster file, as every other verb picks its file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import click
import pytest

from tests.conftest import add_run, fake, free_ports, tfctl
from tfctl.cli.common import Duration
from tfctl.controller.verbs.forget import candidates
from tfctl.runs.record import HostSpec, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState
from tfctl.transport.specs import LocalSpec, SSHSpec


@pytest.fixture
def runs(tmp_path: Path, home: Path) -> dict[str, RunRecord]:
    a, b = tmp_path / "a" / "cluster.yaml", tmp_path / "b.yaml"
    a.parent.mkdir()
    a.write_text("name: a\n")
    b.write_text("name: b\n")
    return {
        "a1": add_run(home, "a-20260101-100000-0001", a, 1_700_000_000, {"worker": 1}),
        "b1": add_run(home, "b-20260102-100000-0002", b, 1_700_100_000, {"worker": 1}),
        "a2": add_run(home, "a-20260103-100000-0003", a, 1_700_200_000, {"worker": 1}),
    }


def listed(home: Path, *args: str, cwd: Path | None = None) -> list[str]:
    result = tfctl(*args, "--json", home=home, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return [r["run_id"] for r in json.loads(result.stdout)]


def test_the_cluster_file_picks_the_runs_wherever_it_is_named(runs, home: Path, tmp_path: Path) -> None:
    a_runs = [runs["a1"].run_id, runs["a2"].run_id]
    b_file = str(tmp_path / "b.yaml")
    assert listed(home, "-f", b_file, "runs") == [runs["b1"].run_id]
    assert listed(home, "runs", "-f", b_file) == [runs["b1"].run_id]
    assert listed(home, "runs", "--file", b_file) == [runs["b1"].run_id]
    assert listed(home, "runs", cwd=tmp_path / "a") == a_runs  # ./cluster.yaml
    assert listed(home, "runs", "-f", "cluster.yaml", cwd=tmp_path / "a") == a_runs


def test_without_a_file_or_with_all_every_run_is_listed(runs, home: Path, tmp_path: Path) -> None:
    every = [r.run_id for r in runs.values()]
    assert listed(home, "runs", cwd=tmp_path) == every  # no ./cluster.yaml here
    assert listed(home, "runs", "--all", cwd=tmp_path / "a") == every


def test_a_file_without_runs_says_so(runs, home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    result = tfctl("runs", "-f", str(other), home=home)
    assert result.returncode == 0 and result.stdout == ""
    assert f"no runs of {other}" in result.stderr and "--all" in result.stderr
    table = tfctl("runs", "-f", str(tmp_path / "b.yaml"), home=home).stdout.splitlines()
    assert table[0].split() == ["RUN", "STARTED", "STATE", "REASON"]
    assert table[1].split()[:4] == [runs["b1"].run_id, *table[1].split()[1:3], "succeeded"]


# --- prune -----------------------------------------------------------------------------------


def stored(run_id: str, file: str, created: float, state: RunState = RunState.SUCCEEDED, **changes) -> RunRecord:
    fields = {"tasks": (), "hosts": (), "grace_period": 1.0, "state": state, **changes}
    return RunRecord(run_id=run_id, cluster_name=run_id.split("-")[0], cluster_file=file, created_at=created, **fields)


def test_prune_keeps_the_newest_ended_runs_of_each_file_and_never_a_live_one() -> None:
    now = 1_800_000_000.0
    a = [stored(f"a-{i}", "/a.yaml", now - 1000 * (10 - i), ended_at=now - 1000 * (10 - i) + 10) for i in range(5)]
    live = stored("a-live", "/a.yaml", now - 50_000, RunState.RUNNING)
    b = [stored(f"b-{i}", "/b.yaml", now - 500 * (10 - i)) for i in range(2)]
    records = [*a, live, *b]
    ids = lambda rs: [r.run_id for r in rs]  # noqa: E731
    assert ids(candidates(records, 3, None, now)) == ["a-0", "a-1"]  # b has only 2; the live run never counts
    assert ids(candidates(records, 1, None, now)) == ["a-0", "a-1", "a-2", "a-3", "b-0"]
    assert ids(candidates(records, 0, 7000, now)) == ["a-0", "a-1", "a-2"]  # ended over 7000 s ago
    assert ids(candidates(records, 0, None, now)) == ["a-0", "a-1", "a-2", "a-3", "a-4", "b-0", "b-1"]
    assert candidates([live], 0, None, now) == []


@pytest.mark.parametrize(
    "text,seconds",
    [("30d", 30 * 86400), ("12h", 43200), ("45m", 2700), ("90s", 90), ("1d12h", 129600), ("2w", 1209600)],
)
def test_durations(text: str, seconds: float) -> None:
    assert Duration().convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["", "7", "7x", "d", "1d 2h", "-1d"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    with pytest.raises(click.BadParameter, match="is not a duration"):
        Duration().convert(text, None, None)


def checkpointing_cluster(tmp_path: Path) -> Path:
    """One worker that writes a checkpoint into the run's own directory and succeeds."""
    cluster = tmp_path / "ckpt" / "cluster.yaml"
    cluster.parent.mkdir()
    cluster.write_text(
        "name: ckpt\n"
        'command: \'mkdir -p "$TFCTL_RUN_DIR/checkpoints" && echo saved > "$TFCTL_RUN_DIR/checkpoints/ckpt-1"\'\n'
        f"jobs:\n  worker: [localhost:{free_ports(1)[0]}]\n"
    )
    return cluster


def run_files(home: Path, run_id: str) -> list[Path]:
    """What a run left on this machine: its record, its task state and logs, its own directory."""
    return [home / "runs" / run_id, *home.glob(f"hosts/*/tasks/{run_id}"), home / "work" / run_id]


def test_prune_removes_old_runs_here_and_on_their_hosts_and_keeps_the_rest(tmp_path: Path, home: Path) -> None:
    cluster = checkpointing_cluster(tmp_path)
    ids = []
    for _ in range(3):
        up = tfctl("-f", str(cluster), "up", home=home)
        assert up.returncode == 0, up.stderr
        ids.append(listed(home, "runs", "-f", str(cluster))[-1])
    for run_id in ids:
        assert (home / "work" / run_id / "checkpoints" / "ckpt-1").read_text() == "saved\n"
        assert all(p.exists() for p in run_files(home, run_id))

    dry = tfctl("runs", "-f", str(cluster), "--prune", "--keep", "1", "--dry-run", home=home)
    assert dry.returncode == 0, dry.stderr
    assert "would remove 2 of 2 runs" in dry.stderr and "nothing was removed" in dry.stderr
    assert ids[0] in dry.stdout and ids[1] in dry.stdout and ids[2] not in dry.stdout
    assert f"localhost: {home / 'hosts'}" in dry.stdout and str(home / "work" / ids[0]) in dry.stdout
    assert all(p.exists() for run_id in ids for p in run_files(home, run_id))

    report = json.loads(tfctl("runs", "-f", str(cluster), "--prune", "--keep", "1", "--json", home=home).stdout)
    assert report["dry_run"] is False and report["unreachable"] == {}
    assert [(r["run_id"], r["removed"], r["problems"]) for r in report["runs"]] == [
        (ids[0], True, []),
        (ids[1], True, []),
    ]
    assert report["runs"][0]["bytes"] > 0 and len(report["runs"][0]["paths"]["localhost"]) == 2
    assert not any(p.exists() for run_id in ids[:2] for p in run_files(home, run_id))
    assert all(p.exists() for p in run_files(home, ids[2]))
    assert listed(home, "runs", "-f", str(cluster)) == ids[2:]
    again = tfctl("runs", "-f", str(cluster), "--prune", "--keep", "1", home=home)
    assert again.returncode == 0 and "nothing to prune" in again.stderr


def test_a_live_run_is_never_pruned(tmp_path: Path, home: Path) -> None:
    ports = free_ports(1)
    cluster = tmp_path / "cluster.yaml"
    command = fake(f"--port {ports[0]} --sleep -1")
    cluster.write_text(f'name: live\ngrace_period: 1\ncommand: "{command}"\njobs:\n  worker: [localhost:{ports[0]}]\n')
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    try:
        pruned = tfctl("runs", "--prune", "--keep", "0", home=home, cwd=tmp_path)
        assert pruned.returncode == 0 and "nothing to prune" in pruned.stderr and "1 live" in pruned.stderr
        assert all(p.exists() for p in run_files(home, run_id))
    finally:
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0
    assert tfctl("runs", "--prune", "--keep", "0", home=home, cwd=tmp_path).returncode == 0
    assert not any(p.exists() for p in run_files(home, run_id))


def test_files_of_a_process_that_still_runs_are_kept(tmp_path: Path, home: Path) -> None:
    """An ended record is not proof: a host keeps a run's files while any process of it runs."""
    record = add_run(home, "x-20260101-100000-0001", tmp_path / "x.yaml", 1_700_000_000, {"worker": 1})
    (home / "work" / record.run_id).mkdir(parents=True)
    straggler = subprocess.Popen(["sleep", "600"], env={**os.environ, "TFCTL_RUN_ID": record.run_id})
    try:
        kept = tfctl("runs", "--prune", "--keep", "0", home=home, cwd=tmp_path)
        assert kept.returncode == 1
        assert f"kept, localhost: processes of the run still run here (pids {straggler.pid})" in kept.stdout
        assert "again" in kept.stderr
        assert (home / "work" / record.run_id).is_dir() and (home / "runs" / record.run_id).is_dir()
    finally:
        straggler.kill()
        straggler.wait()
    done = tfctl("runs", "--prune", "--keep", "0", home=home, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (home / "work" / record.run_id).exists() and not (home / "runs" / record.run_id).exists()


def test_an_unreachable_host_is_named_and_its_runs_stay_recorded(tmp_path: Path, home: Path) -> None:
    ghost = HostSpec("ghost", None, "~/.tfctl", SSHSpec(destination="127.0.0.1", port=1))
    here = HostSpec("localhost", None, str(home), LocalSpec())
    file = str(tmp_path / "g.yaml")
    RunStore(home).create(stored("g-20260101-100000-0001", file, 1_700_000_000, hosts=(ghost, here)))
    RunStore(home).create(stored("g-20260102-100000-0002", file, 1_700_100_000, hosts=(here,)))
    result = tfctl("runs", "--prune", "--keep", "0", "--all", home=home)
    assert result.returncode == 1
    assert (
        "error: ghost could not be reached: cannot reach 127.0.0.1 (127.0.0.1:1): connection refused" in result.stderr
    )
    assert "g-20260101-100000-0001  (succeeded" in result.stdout and "kept, ghost could not be reached" in result.stdout
    assert "removed 1 of 2 runs" in result.stderr
    assert listed(home, "runs", "--all") == ["g-20260101-100000-0001"]  # a later prune finishes the job
