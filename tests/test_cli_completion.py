"""Shell completion through the real CLI, as bash, zsh and fish call it: run ids, task names and
templates come from local files only, and a problem completes nothing instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import add_run
from tfctl.runs.record import RunRecord


def complete(home: Path, words: str, shell: str = "bash", cwd: Path | None = None) -> subprocess.CompletedProcess:
    """What tfctl answers a shell that asks to complete the last word of `words`."""
    parts = words.split(" ")
    env = {**os.environ, "TFCTL_HOME": str(home), "_TFCTL_COMPLETE": f"{shell}_complete"}
    if shell == "bash":
        env.update(COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1))
    elif shell == "zsh":
        env.update(COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1))
    else:  # fish passes the line so far and the word under the cursor
        env.update(COMP_WORDS=words, COMP_CWORD=parts[-1])
    return subprocess.run([sys.executable, "-m", "tfctl"], env=env, cwd=cwd, capture_output=True, text=True, timeout=30)


def bash_values(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines() if line.startswith("plain,")]


@pytest.fixture
def runs(tmp_path: Path, home: Path) -> dict[str, RunRecord]:
    a, b = tmp_path / "a" / "cluster.yaml", tmp_path / "b.yaml"
    a.parent.mkdir()
    a.write_text("name: a\n")
    b.write_text("name: b\n")
    return {
        "a-old": add_run(home, "a-20260101-100000-0001", a, 1_700_000_000, {"ps": 1, "worker": 2}),
        "a-new": add_run(home, "a-20260102-100000-0002", a, 1_700_100_000, {"chief": 1, "worker": 1}),
        "b": add_run(home, "b-20260103-100000-0003", b, 1_700_200_000, {"worker": 3}),
    }


def test_run_ids_complete_newest_first_by_prefix(runs, home: Path) -> None:
    ids = bash_values(complete(home, "tfctl status --run "))
    assert ids == ["b-20260103-100000-0003", "a-20260102-100000-0002", "a-20260101-100000-0001"]
    assert bash_values(complete(home, "tfctl down --run a-")) == ids[1:]
    assert bash_values(complete(home, "tfctl logs --run a-20260101")) == ids[2:]


def test_zsh_and_fish_get_each_run_s_state_as_its_description(runs, home: Path) -> None:
    zsh = complete(home, "tfctl logs --run b", shell="zsh")
    assert zsh.returncode == 0 and zsh.stdout.splitlines()[:3] == [
        "plain",
        "b-20260103-100000-0003",
        zsh.stdout.splitlines()[2],
    ]
    assert zsh.stdout.splitlines()[2].startswith("succeeded, started ")
    fish = complete(home, "tfctl logs --run b", shell="fish")
    assert fish.returncode == 0 and fish.stdout.startswith("plain,b-20260103-100000-0003\tsucceeded, started ")


def test_task_names_come_from_the_run_the_command_would_pick(runs, home: Path, tmp_path: Path) -> None:
    # The newest run of ./cluster.yaml:
    assert bash_values(complete(home, "tfctl logs ", cwd=tmp_path / "a")) == ["chief", "worker", "chief:0", "worker:0"]
    # Of the cluster file named before or after the verb:
    three = ["worker", "worker:0", "worker:1", "worker:2"]
    assert bash_values(complete(home, f"tfctl -f {tmp_path / 'b.yaml'} logs ")) == three
    assert bash_values(complete(home, f"tfctl logs --file {tmp_path / 'b.yaml'} ")) == three
    # Of --run, by prefix, leaving out what is already there:
    run = runs["a-old"].run_id
    assert bash_values(complete(home, f"tfctl logs --run {run} w")) == ["worker", "worker:0", "worker:1"]
    assert bash_values(complete(home, f"tfctl logs --run {run} worker:0 w")) == ["worker", "worker:1"]


def test_nothing_to_complete_is_quiet(runs, home: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert bash_values(complete(home, "tfctl logs ", cwd=empty)) == []  # no ./cluster.yaml, no run
    assert bash_values(complete(home, "tfctl logs --run nosuch-run w")) == []
    run_json = home / "runs" / runs["b"].run_id / "run.json"
    run_json.write_text("{not json")
    assert bash_values(complete(home, f"tfctl logs --run {runs['b'].run_id} ")) == []  # damaged: nothing
    assert runs["b"].run_id not in bash_values(complete(home, "tfctl status --run "))
    assert bash_values(complete(tmp_path / "no-home", "tfctl status --run ")) == []


def test_templates_and_verbs_complete_too(home: Path) -> None:
    assert "parameter-server" in bash_values(complete(home, "tfctl init -t "))
    assert bash_values(complete(home, "tfctl st")) == ["status"]


def test_bash_source_prints_the_completion_script(home: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tfctl"],
        env={**os.environ, "_TFCTL_COMPLETE": "bash_source", "TFCTL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0 and "_tfctl_completion" in result.stdout and "complete " in result.stdout
