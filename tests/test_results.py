"""A run's result from its tasks' final evaluation lines (`tf/results.py`): the templates' and
examples' own lines, a recorded TF log searched as a host searches it, and `metrics:` regexes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_progress import NOW, write_log
from tfctl.engine.observed import TaskStatus
from tfctl.runs.record import ProgressSpec
from tfctl.supervisor.marks import recent_marks
from tfctl.supervisor.protocol import Mark, TaskState
from tfctl.tf.progress import RunProgress
from tfctl.tf.results import Metric, ResultReader, result_json, result_text

DATA = Path(__file__).resolve().parent / "data" / "tf_logs"

# What each template and example prints at its end (their f-strings, filled in), and its reading.
FINAL_LINES = {
    "examples/mnist": (
        "final test accuracy 0.9721 after 600 global steps (2.0s, 303.2 steps/s)",
        {"accuracy": (0.9721, 600)},
    ),
    "templates, examples/allreduce": (
        "final step 176 loss 0.0214 accuracy 0.9916 time 6.6s steps/s 26.6 checkpoint /root/.tfctl/work/x/ckpt",
        {"loss": (0.0214, 176), "accuracy": (0.9916, 176)},
    ),
    "examples/async-vs-sync": (
        "final step 600 loss 0.1200 accuracy 0.9500 time 9.1s steps/s 66.0 checkpoint /c mode sync examples/s 4224.0",
        {"loss": (0.12, 600), "accuracy": (0.95, 600), "examples/s": (4224.0, 600)},
    ),
    "TF Estimator": (
        "INFO:tensorflow:Saving dict for global step 600: accuracy = 0.97, global_step = 600, loss = 0.1",
        {"accuracy": (0.97, 600), "loss": (0.1, 600)},
    ),
    "a training line is no result": ("step 599 worker 0 loss 0.0100 accuracy 1.0000", {}),
    "nor a step counter's summary": ("INFO:tensorflow:loss = 0.3, step = 120", {}),
}


@pytest.mark.parametrize("line, expected", list(FINAL_LINES.values()), ids=list(FINAL_LINES))
def test_the_final_lines_of_the_templates_and_examples_are_read(line: str, expected: dict) -> None:
    assert ResultReader().line(line) == expected


def status_of(task: str, *lines: str, at: float = NOW) -> TaskStatus:
    job, index = task.split(":")
    marks = tuple(Mark(at + i, line) for i, line in enumerate(lines))
    return TaskStatus(task, job, int(index), "localhost", 2222, TaskState.SUCCEEDED, marks=marks)


def test_a_recorded_mnist_log_searched_as_its_host_does_gives_the_final_test_accuracy(tmp_path: Path) -> None:
    log = write_log(tmp_path, [(NOW - 5, (DATA / "healthy_chief_worker0.log").read_bytes())])
    progress = RunProgress(ProgressSpec())
    marks = recent_marks(log, progress.rule(), NOW)
    result = progress.results.read([with_marks(marks)])
    assert result == {"accuracy": Metric(0.9666, 601, "worker:0")}
    assert result_text(result) == "accuracy 0.9666 (step 601, worker:0)"
    assert result_json(result) == {"accuracy": {"value": 0.9666, "step": 601, "task": "worker:0"}}


def with_marks(marks: list[Mark]) -> TaskStatus:
    return TaskStatus("worker:0", "worker", 0, "localhost", 2222, TaskState.SUCCEEDED, marks=tuple(marks))


def test_the_chief_and_worker_0_speak_for_the_run_and_a_tasks_newest_line_wins() -> None:
    statuses = [
        status_of("worker:1", "final step 10 loss 0.5 accuracy 0.5"),
        status_of("worker:0", "final step 5 loss 0.9 accuracy 0.1", "final step 9 loss 0.2 accuracy 0.8"),
        status_of("ps:0", "final step 1 loss 9.0 accuracy 0.0 examples/s 12.5"),
    ]
    result = ResultReader().read(statuses)
    assert result == {
        "loss": Metric(0.2, 9, "worker:0"),
        "accuracy": Metric(0.8, 9, "worker:0"),
        "examples/s": Metric(12.5, 1, "ps:0"),
    }
    assert result_text(result).startswith("loss 0.2 (step 9, worker:0), accuracy 0.8 (step 9, worker:0)")


def test_metrics_regexes_replace_the_built_in_lines_with_the_value_and_step_groups_they_name() -> None:
    reader = ResultReader(
        {
            "top1": r"eval top1=(?P<top1>[0-9.]+) at (?P<step>\d+)",
            "loss": r"eval .*loss=(?P<value>[0-9.]+)",
            "bleu": r"(?P<step>\d+): BLEU ([0-9.]+)",
        }
    )
    assert reader.line("eval top1=0.761 at 9000 loss=1.25") == {"top1": (0.761, 9000), "loss": (1.25, None)}
    assert reader.line("9000: BLEU 27.4") == {"bleu": (27.4, 9000)}
    assert reader.line("final step 600 loss 0.02 accuracy 0.97") == {}  # the built-in lines no more
    assert reader.line("eval top1=n/a at 9000") == {}  # no number: no figure
    # The host's one regex holds every metric's, their groups unnamed (two name `step`).
    progress = RunProgress(ProgressSpec(metrics={"a": r"a (?P<step>\d+) (\d+)", "b": r"b (?P<step>\d+) (\d+)"}))
    assert progress.results.pattern == r"(?P<result>(?:a (\d+) (\d+))|(?:b (\d+) (\d+)))"
    assert progress.rule().pattern.startswith(progress.results.pattern + "|")


def test_the_hosts_pattern_is_linear_in_a_lines_length() -> None:
    """A task's 200 000-character line (the hostile-output test prints one) once held each host's
    supervisor for hours: a leading `.*?` under `search` tried every start, quadratic in the
    line. The search runs in a child (a regex holds the GIL), killed if it outlasts 20 s."""
    pattern = RunProgress(ProgressSpec()).rule().pattern
    code = f"import re; re.compile({pattern!r}.encode()).search(b'y' * 200_000)"
    subprocess.run([sys.executable, "-c", code], timeout=20, check=True)
    assert ResultReader().line("INFO:tensorflow:Saving dict for global step 600: loss = 0.1") == {"loss": (0.1, 600)}
