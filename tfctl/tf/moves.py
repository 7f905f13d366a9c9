"""What moving a task to another host means to TensorFlow: which other tasks must start again
because their cluster spec names the moved address, and each moved or restarted task's spec
with the new address in its TF_CONFIG, its command and its environment.

Which tasks talk to which: a tensor goes from one task to another by the receiver asking the
sender (TF's `RpcRemoteRendezvous::RecvFromRemoteAsync` calls `RecvTensor` on the sender; a send
only buffers locally), at the address in the receiver's own cluster spec (the worker cache
`GrpcServer::Init` builds once from the server's ServerDef; `tf.train.Server` cannot change it).
Every worker (and chief) pulls the variables from each ps, so a ps moved restarts them all, from
their checkpoints (the other ps never ask each other). Each ps pulls the gradients from every
worker at the address it was started with: a worker moved alone trains on the spare but its
first step waits forever for the ps (seen with the between-graph template on the simulated
hosts), so every ps restarts, and with them, their variables gone, every worker and chief, from
the chief's checkpoint. (Only a program that propagates its cluster per session, with shared
session state, could move a worker alone; the templates do not, nor do the public programs.)
All-reduce peers (MultiWorkerMirrored, no ps) form one collective group whose peers are fixed
when collectives are enabled, once per process, and which checks each peer's incarnation: a
moved peer restarts it whole. The evaluator only reads checkpoints: it talks to nobody.
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
    elif job == "ps" or "ps" not in jobs:
        talk = TRAINING_JOBS  # a ps's clients; or one collective group
    else:
        talk = ("ps", *TRAINING_JOBS)  # every ps pulls its gradients; a ps restarted restarts its clients
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
