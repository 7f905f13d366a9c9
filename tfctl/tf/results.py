"""A run's result: the numbers its tasks' final evaluation lines print, read from their output.

The last training batch's accuracy is no result; the line a program prints once it evaluated is.
Recognised out of the box (the templates', the examples' and TF Estimator's own):

    final step 600 loss 0.0214 accuracy 0.9916 time 6.6s steps/s 26.6 checkpoint ...
    final test accuracy 0.9721 after 600 global steps (2.0s, 303.2 steps/s)
    INFO:tensorflow:Saving dict for global step 600: accuracy = 0.97, global_step = 600, loss = 0.1

A cluster file's `metrics:` (name -> regex, the value in the group of that name, `value`, or the
first group; the step in an optional `step` group) replaces them. Hosts only find the lines, as
marks of kind `result` beside the progress ones (`progress.RunProgress.rule`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from tfctl.engine.observed import TaskStatus

RESULT = "result"  # the kind of mark of a result line
BUILT_IN = (
    r"^(?i:final)\b(?P<numbers>.*)",
    r"\bSaving dict for global step (?P<step>\d+): (?P<numbers>.*)",
)
STEP = re.compile(r"\b(?:global[ _])?step[ :=#]*(?P<at>\d+)|\b(?P<of>\d+) (?:global )?steps\b", re.IGNORECASE)
JOB_ORDER = ("chief", "worker", "evaluator", "ps")  # whose figure stands where two tasks print one


# `name value`, `name: value`, `name = value` in a progress line: the model's own numbers (loss,
# accuracy, ...). Not a number glued to a unit (`12.3s`), nor a name that counts steps or time;
# after a bare space only a fraction (`loss 0.3`), as `using 4 GPUs` is no metric.
METRIC = re.compile(
    r"(?<![\w/.])(?P<name>[A-Za-z][A-Za-z0-9_]*(?:[/.][A-Za-z][A-Za-z0-9_]*)*)(?P<sep>\s*[:=]\s*|\s+)"
    r"(?P<value>nan|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.%/])"
)
NOT_METRICS = ("step", "epoch", "sec", "time", "eta", "index", "task", "pid", "port", "of", "batch")


def metrics(line: str) -> dict[str, float]:
    """The model's named numbers in one progress line, e.g. `step 120 loss 0.31 accuracy 0.9`
    -> {"loss": 0.31, "accuracy": 0.9}; Keras' `- loss: 0.31 - accuracy: 0.9` alike."""
    found = {}
    for m in METRIC.finditer(line):
        name, value = m.group("name"), m.group("value")
        if m.group("sep").isspace() and value.lstrip("+-").isdigit():
            continue
        if not any(word in name.lower() for word in NOT_METRICS) and len(name) > 1:
            found[name] = float(m.group("value"))
    return found


@dataclass(frozen=True)
class Metric:
    """One number of a run's result, the step it came at and the task that printed it."""

    value: float
    step: int | None = None
    task: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "step": self.step, "task": self.task}


def unnamed(pattern: str) -> str:
    """`pattern` with its named groups made plain: many patterns go into one host regex."""
    return re.sub(r"\(\?P<\w+>", "(", pattern)


def value_group(regex: re.Pattern[str], name: str) -> str | int:
    """The group that holds a metric's value: the one named as the metric, `value`, else the
    first that is not `step`; the cluster file's check (`config/metrics.py`) refuses a regex
    with none."""
    for named in (name, "value"):
        if named in regex.groupindex:
            return named
    steps = set(regex.groupindex.values()) if "step" in regex.groupindex else set()
    return next(i for i in range(1, regex.groups + 1) if i not in steps)


class ResultReader:
    """The pattern hosts search for, and the numbers of the lines they find."""

    def __init__(self, user: Mapping[str, str] | None = None) -> None:
        self.user = {name: re.compile(p) for name, p in (user or {}).items()}
        self._built_in = [re.compile(p) for p in BUILT_IN]
        sources = list(user.values()) if user else list(BUILT_IN)
        self.pattern = f"(?P<{RESULT}>" + "|".join(f"(?:{unnamed(p)})" for p in sources) + ")"

    def line(self, text: str) -> dict[str, tuple[float, int | None]]:
        """The result's numbers in one line: name -> (value, step)."""
        found: dict[str, tuple[float, int | None]] = {}
        if self.user:
            for name, regex in self.user.items():
                m = regex.search(text)
                try:
                    value = float(m.group(value_group(regex, name))) if m else None
                except (TypeError, ValueError):  # the group took no part, or holds no number
                    continue
                if m is None or value is None:
                    continue
                step = m.groupdict().get("step")
                found[name] = (value, int(step) if step and step.isdigit() else None)
            return found
        for regex in self._built_in:
            m = regex.search(text)
            if m is None:
                continue
            step = m.groupdict().get("step") or step_in(m.group("numbers"))
            return {name: (value, int(step) if step else None) for name, value in metrics(m.group("numbers")).items()}
        return found

    def read(self, statuses: Sequence[TaskStatus]) -> dict[str, Metric]:
        """The run's result from its tasks' marks: per name the newest line of the first task
        that printed one, the chief and worker 0 first."""
        result: dict[str, Metric] = {}
        for s in sorted(statuses, key=lambda s: (rank(s.job), s.index)):
            own: dict[str, Metric] = {}
            for mark in s.marks:
                for name, (value, step) in self.line(mark.text).items():
                    own[name] = Metric(value, step, s.task)
            for name, metric in own.items():
                result.setdefault(name, metric)
        return result


def step_in(text: str) -> str | None:
    """`step 600` or `after 600 global steps` in a final line: the step its figures are of."""
    m = STEP.search(text)
    return None if m is None else m.group("at") or m.group("of")


def rank(job: str) -> int:
    return JOB_ORDER.index(job) if job in JOB_ORDER else len(JOB_ORDER)


def result_text(result: Mapping[str, Metric]) -> str:
    """`accuracy 0.9721, loss 0.0214 (step 600, worker:0)`; "" for none."""
    if not result:
        return ""
    figures = ", ".join(f"{name} {m.value:.4g}" for name, m in result.items())
    where = {(m.step, m.task) for m in result.values()}
    if len(where) == 1:
        step, task = next(iter(where))
        return figures + f" ({'step ' + str(step) + ', ' if step is not None else ''}{task})"
    return ", ".join(
        f"{name} {m.value:.4g} ({'step ' + str(m.step) + ', ' if m.step is not None else ''}{m.task})"
        for name, m in result.items()
    )


def result_json(result: Mapping[str, Metric]) -> dict[str, dict[str, Any]]:
    return {name: m.to_json() for name, m in result.items()}


def kept_result(kept: Mapping[str, Any] | None) -> dict[str, Metric]:
    """The result a run's record kept when it stopped (its hosts' logs may be gone since)."""
    return {name: Metric(m["value"], m.get("step"), m.get("task", "")) for name, m in (kept or {}).items()}
