"""Slurm's accounting as a real slurmdbd (on MariaDB) records it, beside tfctl's own figures:
`status --json`, `runs --json` and the report carry what `sacct` itself says of the run's
allocation. A lab of its own (`SlurmLab(accounting=True)`), so the other Slurm tests do not pay
for the database."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from bench.netns_hosts import require_netns
from bench.slurm_lab import SlurmLab, missing_binaries
from bench.waiting import wait_until
from tests.conftest import no_warnings, tfctl
from tests.test_slurm import HET_FILE, fake_file, fake_slurm, on_slurm, run_processes
from tfctl.backends.slurm.sacct import ENDED, FORMAT, slurm_accounting
from tfctl.runs.accounting import unsettled
from tfctl.runs.store import RunStore

# The lab's real sacct, verbatim: a heterogeneous job tfctl released (`scancel`: "by 0", its uid).
# Then a job as sacct shows one slurmdbd has not yet heard start (the controller in it asked).
REAL_SACCT = """\
1+0|CANCELLED by 0|2|2|billing=1,cpu=1,node=1
1+1|CANCELLED by 0|2|4|billing=2,cpu=2,gres/gpu=2,node=1
2|PENDING|0|0|
"""


def test_real_sacct_states_and_when_its_figures_are_settled():
    run, _ = fake_slurm({"sacct": [REAL_SACCT]})
    figures = slurm_accounting(["1"], run, components=2)
    assert figures["allocations"] == [
        {"id": "1", "state": "CANCELLED", "elapsed_seconds": 2.0, "cpu_hours": 0.0017, "gpu_hours": 0.0011}
    ]
    assert figures["settled"] is True
    assert slurm_accounting(["1", "2"], run, components=2)["settled"] is False  # 2 may still run
    # A component slurmdbd has not recorded yet: the sum may still grow.
    first_only, _ = fake_slurm({"sacct": [REAL_SACCT.splitlines()[0]]})
    assert slurm_accounting(["1"], first_only, components=2)["settled"] is False
    assert unsettled(slurm_accounting(["1", "3"], run, components=2))  # 3 not recorded at all
    assert not unsettled({"source": "sacct", "enabled": False, "why": "Slurm accounting storage is disabled"})


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    require_netns()
    missing = missing_binaries(accounting=True)
    if missing:
        if os.environ.get("TFCTL_REQUIRE_NETNS", "") not in ("", "0"):
            pytest.fail(f"Slurm accounting is required here but missing: {', '.join(missing)}", pytrace=False)
        pytest.skip(f"Slurm accounting is not installed (apt install slurmdbd mariadb-server): missing {missing}")
    workdir = tmp_path_factory.mktemp("sacct")
    with SlurmLab(workdir, accounting=True, prefix="tfctl-sa", bridge="tfctlbr45", subnet="10.77.45") as lab:
        yield lab


def sacct_says(slurm: SlurmLab, job: str, components: int = 1) -> list[list[str]]:
    """sacct's own lines of the allocation (a heterogeneous job: one per component), once every
    one of them is recorded as ended (slurmdbd hears of the end a moment after squeue). Once, on
    a loaded machine, slurmdbd listed a heterogeneous job's leader alone as `1`, ended, before
    it recorded the components: so all `components` lines are awaited, as tfctl's `settled` does."""
    argv = ["sacct", "--parsable2", "--noheader", "--allocations", f"--jobs={job}", f"--format={','.join(FORMAT)}"]
    return wait_until(
        lambda: [line.split("|") for line in slurm.run(argv).stdout.splitlines()],
        20,
        f"sacct to record job {job}'s end",
        until=lambda lines: len(lines) == components and all(fields[1].split()[0] in ENDED for fields in lines),
        interval=0.5,
    )


def expected(lines: list[list[str]]) -> dict[str, Any]:
    """What tfctl should show of the allocation, worked out here from sacct's lines."""
    gpus = [sum(int(t.split("=")[1]) for t in fields[4].split(",") if t.startswith("gres/gpu=")) for fields in lines]
    return {
        "id": lines[0][0].partition("+")[0],
        "state": lines[0][1].split()[0],
        "elapsed_seconds": float(max(int(fields[2]) for fields in lines)),
        "cpu_hours": round(sum(int(fields[3]) for fields in lines) / 3600, 4),
        "gpu_hours": round(sum(g * int(fields[2]) for g, fields in zip(gpus, lines)) / 3600, 4),
    }


@pytest.mark.netns
def test_a_heterogeneous_runs_figures_are_what_sacct_recorded(slurm, tmp_path, home):
    """A ps on `cpu`, two workers with a stand-in GPU each on `gpu` (GRES, which the lab's
    slurmdbd records): one job of two components, whose lines tfctl sums."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(HET_FILE)
    up = on_slurm(slurm, home, "-f", str(cluster), "up")
    assert up.returncode == 0, up.stderr
    assert "job succeeded: worker:0 finished successfully" in up.stderr
    no_warnings(up.stderr)
    assert slurm.jobs() == []
    run = json.loads(on_slurm(slurm, home, "runs", "--json").stdout)[-1]
    assert run_processes(slurm, run["run_id"]) == []
    job = run["accounting"]["slurm"]["allocations"][0]["id"]
    lines = sacct_says(slurm, job, components=2)
    assert [fields[0] for fields in lines] == [f"{job}+0", f"{job}+1"]
    assert "gres/gpu=2" in lines[1][4]  # the workers' stand-in GPUs, as Slurm recorded them
    want = expected(lines)
    assert want["state"] == "CANCELLED" and lines[0][1] == "CANCELLED by 0"  # tfctl released it
    assert want["gpu_hours"] > 0 and want["cpu_hours"] > 0
    run = json.loads(on_slurm(slurm, home, "runs", "--json").stdout)[-1]
    figures = run["accounting"]["slurm"]
    assert figures["enabled"] and figures["settled"] and figures["allocations"] == [want]
    assert run["accounting"]["total"]["wall_seconds"] > 0  # tfctl's own, beside
    shown = json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)["run"]
    assert shown["accounting"]["slurm"]["allocations"] == [want]
    assert shown["slurm"]["accounting"]["allocations"] == [want]  # asked of sacct now
    report = tfctl("-f", str(cluster), "report", "-o", str(tmp_path / "r.html"), home=home, env=slurm.env())
    assert report.returncode == 0, report.stderr
    assert f"job {job} CANCELLED: " in (tmp_path / "r.html").read_text()


@pytest.mark.netns
def test_figures_taken_inside_the_allocation_are_settled_once_it_ended(slurm, tmp_path, home):
    """The run's controller in its batch script releases the allocation from inside: sacct says
    RUNNING then. `runs --json` asks again while the record is unsettled, and keeps the answer."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(fake_file(sleep=1).replace("controller: login", "controller: allocation"))
    up = on_slurm(slurm, home, "-f", str(cluster), "up")
    assert up.returncode == 0, up.stderr
    assert "job succeeded: worker:0 finished successfully" in up.stderr
    wait_until(slurm.jobs, 20, "the batch job to end", until=lambda jobs: jobs == [], interval=0.2)
    (record,) = RunStore(home).all()
    # As the controller took them, the job still running (PENDING even: slurmdbd lags behind).
    kept = (record.accounting or {})["slurm"]
    assert kept["settled"] is False and kept["allocations"][0]["state"] in ("PENDING", "RUNNING")
    job = kept["allocations"][0]["id"]
    lines = sacct_says(slurm, job)
    want = expected(lines)
    assert want["state"] == "COMPLETED" and want["gpu_hours"] == 0
    shown = json.loads(on_slurm(slurm, home, "-f", str(cluster), "status", "--json").stdout)["run"]
    assert shown["accounting"]["slurm"]["allocations"] == [want]  # sacct's answer now, not the one kept
    runs = on_slurm(slurm, home, "runs", "--json")
    assert runs.returncode == 0, runs.stderr
    figures = json.loads(runs.stdout)[-1]["accounting"]["slurm"]
    assert figures["settled"] and figures["allocations"] == [want]
    # Kept: read again where no Slurm answers, the settled figures stand.
    away = tfctl("runs", "--json", home=home, env={"SLURM_CONF": str(tmp_path / "no-slurm.conf")})
    assert json.loads(away.stdout)[-1]["accounting"]["slurm"]["allocations"] == [want]
    assert slurm.jobs() == [] and run_processes(slurm, record.run_id) == []
