"""The Slurm backend's cluster-file keys: the `slurm:` section, and a job's `count` and `port`.

Under `backend: slurm` a job says how many tasks it has, not where they run: the nodes come from
the allocation. The checks that span keys make sure a file uses one way or the other, never half
of each. `tfctl.config` reads these through the backend registry (`SECTIONS`, `JOB_KEYS`,
`DESCRIPTION`, `settings`, `check`), as it reads every backend's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from tfctl.config.base import (
    INVALID,
    Doc,
    Section,
    Validator,
    _choice,
    _leaf,
    _string,
    _whole_number,
    type_error,
)
from tfctl.config.model import JOB_NAMES


@dataclass(frozen=True)
class SlurmSettings:
    """The `slurm:` section: what `up` asks Slurm for; unset fields are Slurm's defaults."""

    partition: str | None = None
    time: str | None = None  # Slurm's time format, e.g. "01:00:00"
    account: str | None = None
    qos: str | None = None
    nodes: int | None = None  # None: one node per task
    extra: tuple[str, ...] = ()  # more sbatch arguments, as written
    resubmit: int = 0  # new allocations for the same run when one ends by its time limit or preemption
    signal_before: int | None = None  # seconds before the limit Slurm sends the tasks SIGTERM (--signal)
    # Where the run's controller runs: in the allocation's batch script (`allocation`, which a login
    # node's reboot cannot end), or here (`login`).
    controller: str = "allocation"
    containers: str = "auto"  # CONTAINER_WAYS: who runs the tasks' containers (`pyxis.py`)


@dataclass(frozen=True)
class SlurmJobSettings:
    """A job's own `slurm:` keys: what its tasks' nodes must be. Jobs that differ here are the
    components of one heterogeneous job; unset fields are the `slurm:` section's (Slurm's)."""

    partition: str | None = None
    constraint: str | None = None  # node features, as `--constraint` takes them
    mem: str | None = None  # memory per node, as `--mem` takes it ("32G")
    nodes: int | None = None  # None: one node per task
    extra: tuple[str, ...] = ()  # more sbatch arguments for this component, after the section's


_TIME_RE = re.compile(r"(\d+-)?\d+(:\d+){0,2}|\d+-\d+|UNLIMITED|INFINITE", re.IGNORECASE)
_EXAMPLE = "jobs: {ps: {count: 1, port: 2222}, worker: {count: 2, port: 2222}}"


def _time(doc: Doc, path: str, value: Any) -> Any:
    text = doc.raw(path) if isinstance(value, int) and not isinstance(value, bool) else value
    text = _string(doc, path, text, 'time: "01:00:00"')
    if text is INVALID:
        return INVALID
    if not _TIME_RE.fullmatch(text):
        return doc.problem(
            path,
            f"is not a Slurm time limit: {text!r}",
            'write minutes, "HH:MM:SS" or "D-HH:MM:SS", e.g. `time: "01:00:00"`',
        )
    return text


def _text(key: str, example: str) -> Validator:
    def validate(doc: Doc, path: str, value: Any) -> Any:
        return _string(doc, path, value, f"{key}: {example}")

    return validate


def _extra(doc: Doc, path: str, value: Any) -> Any:
    example = 'extra: ["--constraint=v100", "--mem=32G"]'
    if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith("-") for v in value):
        return type_error(doc, path, "a list of sbatch options (each starting with -)", value, f"e.g. `{example}`")
    return tuple(value)


_MEM_RE = re.compile(r"\d+[KMGT]?", re.IGNORECASE)


def _mem(doc: Doc, path: str, value: Any) -> Any:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    text = _string(doc, path, text, 'mem: "32G"')
    if text is INVALID:
        return INVALID
    if not _MEM_RE.fullmatch(text):
        return doc.problem(
            path, f"is not a Slurm memory size: {text!r}", 'write megabytes or a size with K, M, G or T: `mem: "32G"`'
        )
    return text


CONTROLLERS = ("login", "allocation")
CONTAINER_WAYS = ("auto", "pyxis", "runtime")

DESCRIPTION = "`slurm` on nodes Slurm allocates"

slurm_section = Section(
    {
        "partition": _text("partition", "debug"),
        "time": _time,
        "account": _text("account", "myproject"),
        "qos": _text("qos", "normal"),
        "nodes": _whole_number("nodes", 1, "e.g. `nodes: 2`; leave it out for one node per task"),
        "extra": _extra,
        "resubmit": _whole_number("resubmit", 0, "e.g. `resubmit: 3`: up to 3 more allocations for the run"),
        "signal_before": _whole_number("signal_before", 1, "e.g. `signal_before: 60` (seconds)"),
        "controller": _choice(
            CONTROLLERS, "`login`: on the machine that ran `up`; `allocation`: in the batch script of the allocation"
        ),
        "containers": _choice(
            CONTAINER_WAYS,
            "`pyxis`: each step in its node's container (`srun --container-image`); "
            "`runtime`: the node's podman, docker or apptainer inside each step; `auto`: pyxis where srun has it",
        ),
    },
    SlurmSettings,
    'slurm: {partition: debug, time: "01:00:00"}',
)

job_slurm_section = Section(
    {
        "partition": _text("partition", "gpu"),
        "constraint": _text("constraint", "v100"),
        "mem": _mem,
        "nodes": _whole_number("nodes", 1, "e.g. `nodes: 2`; leave it out for one node per task"),
        "extra": _extra,
    },
    SlurmJobSettings,
    "slurm: {partition: gpu, nodes: 1}",
)

SECTIONS: dict[str, Validator] = {"slurm": slurm_section}
JOB_KEYS: dict[str, Validator] = {
    "slurm": job_slurm_section,
}

# One line per key for the generated reference (see `tfctl.config.key_docs`).
KEY_DOCS: dict[str, str] = {
    "slurm": "With `backend: slurm`: what `up` asks Slurm for; unset values are Slurm's defaults.",
    "slurm.partition": "Partition to allocate in.",
    "slurm.time": 'Time limit, in Slurm\'s format (minutes, "HH:MM:SS" or "D-HH:MM:SS").',
    "slurm.account": "Account to charge.",
    "slurm.qos": "Quality of service.",
    "slurm.nodes": "Nodes to allocate; unset: one per task.",
    "slurm.extra": "More sbatch options, as written (each starting with `-`).",
    "slurm.resubmit": "New allocations for the same run when one ends by its time limit or preemption.",
    "slurm.signal_before": "Seconds before the limit that Slurm sends the tasks SIGTERM (`--signal=TERM@N`).",
    "slurm.controller": "Where the run's controller runs: `allocation` (its first node) or `login` (where `up` ran).",
    "slurm.containers": (
        "Who runs the tasks' `container:`: `pyxis` (each step in its node's container, `srun --container-image`),"
        " `runtime` (the node's podman, docker or apptainer inside each step), or `auto` (pyxis where srun has it)."
    ),
    "jobs.<job>.slurm": "With `backend: slurm`: the job's own nodes; jobs that differ make a heterogeneous job.",
    "jobs.<job>.slurm.partition": "Partition of the job's nodes, instead of `slurm.partition`.",
    "jobs.<job>.slurm.constraint": "Node features the job's nodes must have (`--constraint`).",
    "jobs.<job>.slurm.mem": 'Memory per node of the job\'s nodes (`--mem`), e.g. "32G".',
    "jobs.<job>.slurm.nodes": "Nodes for the job's tasks; unset: one per task.",
    "jobs.<job>.slurm.extra": "More sbatch options for the job's nodes, after `slurm.extra`.",
}


def settings(sections: Mapping[str, Any]) -> SlurmSettings:
    """The run's `ClusterConfig.backend_settings`, from the validated sections."""
    section = sections.get("slurm")
    return section if isinstance(section, SlurmSettings) else SlurmSettings()


def check(doc: Doc, root: Mapping[str, Any]) -> None:
    """Each job is placed the way the backend places tasks: `hosts` over ssh, `count` on Slurm."""
    slurm = root.get("backend") == "slurm"
    jobs = root.get("jobs")
    if "slurm" in root and not slurm and root.get("backend") in (None, "ssh"):
        doc.problem("slurm", "is set, but the backend is ssh", "add `backend: slurm`, or remove the `slurm:` section")
    if slurm and "hosts" in root:
        doc.problem("hosts", "lists hosts, but Slurm picks the nodes", "remove `hosts:` (its settings are for ssh)")
    if slurm and "pool" in root:
        doc.problem("pool", "asks a pool for hosts, but Slurm picks the nodes", "remove `pool:`, or `backend: slurm`")
    if not isinstance(jobs, dict) or "pool" in root and not slurm:  # a pool's jobs are checked with `pool:`
        return
    for name, spec in jobs.items():
        if name not in JOB_NAMES or spec is INVALID:
            continue
        path = f"jobs.{name}"
        keys = spec if isinstance(spec, dict) else {"hosts": spec}
        if slurm and "count" not in keys:
            doc.problem(path, "has no `count`: on Slurm a job says how many tasks, not where", f"e.g. `{_EXAMPLE}`")
        elif slurm and "hosts" in keys:
            doc.problem(f"{path}.hosts", "lists hosts, but Slurm picks the nodes", "remove `hosts:`; keep `count:`")
        elif not slurm:
            for key in ("count", "port"):
                if key in keys:
                    doc.problem(
                        f"{path}.{key}",
                        f"`{key}` asks for tasks to be placed, and nothing here places them",
                        f"add `pool: NAME` (or `backend: slurm`), or list the addresses: `{_leaf(path)}: [host:2222]`",
                    )
            if "slurm" in keys:
                doc.problem(f"{path}.slurm", "is for `backend: slurm`", "add `backend: slurm`, or remove it")
