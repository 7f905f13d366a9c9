"""What moving a task to another host means to TensorFlow: which other tasks must start again
because their cluster spec names the moved address, and each moved or restarted task's spec
with the new address in its TF_CONFIG, its command and its environment.

Which tasks talk to which: a TF1 between-graph worker talks to the ps only, so it moves alone;
every worker (and chief) talks to each ps, so a ps moved restarts them all, from their
checkpoints; a TF2 ParameterServerStrategy chief drives every worker, so it restarts with any of
them; all-reduce peers (MultiWorkerMirrored, no ps) form one collective group, which a moved peer
restarts whole. The evaluator only reads checkpoints: it talks to nobody.
"""

from __future__ import annotations

import json
import re
from typing import Mapping, Sequence

from tfctl.runs.record import TaskSpec

TRAINING_JOBS = ("chief", "worker")


def peers_to_restart(tasks: Sequence[TaskSpec], moved: str) -> list[str]:
    """The tasks besides `moved` that must start again, with its new address, for the job to go on."""
    jobs = {t.job for t in tasks}
    job = next(t.job for t in tasks if t.name == moved)
    if job == "evaluator":
        talk: tuple[str, ...] = ()
    elif job == "ps":
        talk = TRAINING_JOBS
    elif "ps" not in jobs:
        talk = TRAINING_JOBS  # one collective group
    elif job == "worker" and "chief" in jobs:
        talk = ("chief",)
    else:
        talk = ()  # between-graph: a worker's only peers are the ps
    return [t.name for t in tasks if t.job in talk and t.name != moved]


def readdressed(task: TaskSpec, swaps: Mapping[str, str]) -> TaskSpec:
    """The task with every mention of an old address (host:port) in its TF_CONFIG, command and
    environment replaced by its new one (`swaps`: old -> new): the host lists tfctl rendered there."""
    if not swaps:
        return task
    olds = "|".join(re.escape(old) for old in sorted(swaps, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w.:\[\]-])(" + olds + r")(?![\w.:-])")

    def swap(text: str) -> str:
        return pattern.sub(lambda m: swaps[m.group(1)], text)

    env = {name: value if name == "TF_CONFIG" else swap(value) for name, value in task.env.items()}
    if "TF_CONFIG" in env:
        config = json.loads(task.env["TF_CONFIG"])
        config["cluster"] = {job: [swaps.get(a, a) for a in addresses] for job, addresses in config["cluster"].items()}
        env["TF_CONFIG"] = json.dumps(config, separators=(",", ":"))
    return task.replace(command=swap(task.command), env=env)
