"""The `logdir` key: one directory for a run's TensorBoard summaries, and its `{logdir}` placeholder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfctl import lifecycle
from tfctl.config import load_config, parse_config
from tfctl.errors import ConfigError
from tfctl.runs import RunStore

# -- the logdir key --------------------------------------------------------------------------------

BASE = "name: x\njobs: {worker: [localhost:2222]}\n"


def problems(text: str, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, tmp_path / "cluster.yaml")
    return caught.value.message


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            BASE + "command: run --out {logdir}\n",
            [
                "cluster.yaml:3:10: command: uses `{logdir}`, but the file has no `logdir`",
                "fix: add a top-level `logdir: logs/{run_id}` (relative paths start at each task's workdir)",
            ],
        ),
        (
            "name: x\njobs:\n  worker: {hosts: [localhost:2222], command: 'run {logdir}'}\n",
            ["jobs.worker.command: uses `{logdir}`, but the file has no `logdir`"],
        ),
        (
            BASE + "command: run\nlogdir: logs/{job_name}\n",
            [
                "cluster.yaml:4:9: logdir: unknown placeholder `{job_name}`",
                "fix: `logdir` is one directory for every task: its only placeholder is {run_id}",
            ],
        ),
        (BASE + "command: run\nlogdir: logs/{run}\n", ["did you mean `{run_id}`?"]),
        (BASE + "command: run\nlogdir: 7\n", ["logdir: expected a string, found a number (7)", "fix: quote it"]),
        (
            BASE + "command: run\nlogdir: logs/{run_id\n",
            ["logdir: malformed braces", "placeholders look like `{run_id}`"],
        ),
    ],
)
def test_logdir_mistakes_name_file_line_key_and_fix(text, expected, tmp_path):
    message = problems(text, tmp_path)
    for part in expected:
        assert part in message, message


def test_logdir_fills_its_placeholder_and_the_record(tmp_path, home):
    text = BASE + "command: run --logdir={logdir} --dir {logdir}/x\nlogdir: '~/tb/{run_id} {{x}}'\n"
    (tmp_path / "cluster.yaml").write_text(text)
    record = lifecycle.plan_run(load_config(tmp_path / "cluster.yaml"), RunStore()).record
    assert record.logdir == f"~/tb/{record.run_id} {{x}}"
    # `~/` is left for the host's shell to expand, as for {python}; the rest is one quoted word.
    assert record.tasks[0].command == f"run --logdir=~/'tb/{record.run_id} {{x}}' --dir ~/'tb/{record.run_id} {{x}}'/x"
