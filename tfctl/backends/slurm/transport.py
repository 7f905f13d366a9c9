"""Commands on a node of a Slurm allocation, each as a job step (`srun --overlap` into the job).

Slurm clusters share the filesystem between the login node and the compute nodes, so files are
this machine's files (`put` writes them here, `is_local` is True) while every command runs on the
node. A step that shares the allocation's resources (`--overlap`) starts in a fraction of a second.
"""

from __future__ import annotations

import subprocess
from typing import ClassVar, Optional

from tfctl.errors import HostError
from tfctl.supervisor.records import record
from tfctl.transport.base import Transport, Tunnel
from tfctl.transport.local import LocalTransport
from tfctl.transport.specs import TransportSpec


def step_argv(job_id: str, node: str, *, name: str = "tfctl", extra: tuple[str, ...] = ()) -> list[str]:
    """`srun` placing one task on `node` of job `job_id`; `extra` says what it asks for (its
    component of a heterogeneous job, `--overlap` to run beside whatever steps already run there)."""
    return [
        "srun",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        f"--job-name={name}",
        "--quiet",
        *extra,
    ]


class SlurmTransport(LocalTransport):
    """The transport for a node of the run's allocation."""

    # srun reports every stream tfctl ends (its conversations) as a cancelled step: not news.
    _stream_stderr = subprocess.DEVNULL

    def __init__(self, host: str, job_id: str, het_group: int | None = None) -> None:
        super().__init__(host)
        self.job_id = job_id
        self.options = (*([f"--het-group={het_group}"] if het_group is not None else []), "--overlap")

    def _argv(self, command: str, tty: bool = False) -> list[str]:
        extra = (*self.options, *(("--pty",) if tty else ()))
        return [*step_argv(self.job_id, self.host, extra=extra), "/bin/sh", "-c", command]

    def tunnel(self, port: int) -> Tunnel:
        raise HostError(
            self.host, f"cannot forward port {port} from a Slurm node; reach {self.host}:{port} from the login node"
        )


@record
class SlurmStepSpec(TransportSpec):
    """A node of the run's allocation, reached by job steps (in the component of a heterogeneous
    job it belongs to); it shares this machine's files."""

    KIND: ClassVar[str] = "slurm"
    SHARES_FILES: ClassVar[bool] = True
    job_id: str
    het_group: Optional[int] = None

    def connect(self, host: str, accept_new_host_keys: bool = False) -> Transport:
        return SlurmTransport(host, self.job_id, self.het_group)


SPEC = SlurmStepSpec  # what `transport.specs.read_spec` reads a stored spec of kind "slurm" as
