"""Commands on a node of a Slurm allocation, each as a job step (`srun --overlap` into the job).

Slurm clusters share the filesystem between the login node and the compute nodes, so files are
this machine's files (`put` writes them here, `is_local` is True) while every command runs on the
node. A step that shares the allocation's resources (`--overlap`) starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from typing import ClassVar, List, Optional, Sequence

from tfctl.supervisor.records import field, record
from tfctl.transport.base import Transport, Tunnel, shell_path
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

    def __init__(
        self,
        host: str,
        job_id: str,
        het_group: int | None = None,
        python: str | None = None,
        container: Sequence[str] = (),
    ) -> None:
        super().__init__(host)
        self.job_id = job_id
        self.python = python
        self.options = (*([f"--het-group={het_group}"] if het_group is not None else []), "--overlap")
        self.container = tuple(container)

    def _argv(self, command: str, tty: bool = False, *, boxed: bool = True) -> list[str]:
        """A step running `command`; in the node's container (pyxis) where it has one, unless
        not `boxed`."""
        extra = (*self.options, *(("--pty",) if tty else ()), *(self.container if boxed else ()))
        return [*step_argv(self.job_id, self.host, extra=extra), "/bin/sh", "-c", command]

    def _relay_argv(self, to: str) -> list[str]:
        """A job step on the node joining its stdin and stdout to `to` there: a loopback port, or
        a Unix socket's path (the allocation is the way in, as ssh's channels are elsewhere).
        Plumbing: it runs on the node itself, never in a container."""
        python = shell_path(self.python or sys.executable)  # the files are shared: this one is there too
        return self._argv(f"exec {python} -c {shlex.quote(RELAY)} {shlex.quote(to)}", boxed=False)

    def tunnel(self, port: int) -> Tunnel:
        """A job step on the node relaying its stdin and stdout to the node's loopback `port`: the
        allocation is the way in, as ssh's direct-tcpip channel is elsewhere."""
        proc = subprocess.Popen(
            self._relay_argv(str(port)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            bufsize=0,
        )
        return StepTunnel(self.host, port, proc)


def relay_step(job_id: str, node: str, het_group: int | None, python: str | None, to: str) -> list[str]:
    """`srun` of a step on `node` of the job, beside its others, joining its stdin and stdout to
    `to` there (a loopback port, or a Unix socket's path)."""
    return SlurmTransport(node, job_id, het_group, python)._relay_argv(to)


# Runs on the node, any python 3: bytes from stdin to 127.0.0.1:PORT (a number) or to the Unix
# socket at PATH, and back to stdout; a side that ends half-closes the other. Exits 3 when nothing
# listens there. (A socket's path is reached from its folder: paths are longer than sun_path.)
RELAY = """
import os, socket, sys, threading
to = sys.argv[1]
try:
    if to.isdigit():
        s = socket.create_connection(("127.0.0.1", int(to)), timeout=10)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        os.chdir(os.path.dirname(to))
        s.connect(os.path.basename(to))
except OSError as e:
    sys.stderr.write("relay: %s\\n" % e)
    sys.exit(3)
s.settimeout(None)
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    while data:
        data = data[os.write(1, data):]
"""


class StepTunnel(Tunnel):
    """A connection to a node's loopback port, through a relaying job step's stdin and stdout."""

    def __init__(self, host: str, port: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.host, self.port, self._proc = host, port, proc
        self._in, self._out = proc.stdin, proc.stdout

    def recv(self, size: int) -> bytes:
        return self._out.read(size) or b""  # unbuffered: whatever the step has written, up to `size`

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a pipe's write may take part of it; BrokenPipeError (an OSError) once the step ended
            view = view[self._in.write(view) or 0 :]

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):
            self._in.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._in.close()
        end_step(self._proc, patience=10)
        self._out.close()


def end_step(proc: subprocess.Popen[bytes], patience: float) -> None:
    """End a step's srun (started in a session of its own) if it still runs: SIGTERM to its group
    (srun ends its step with it), then SIGKILL after `patience` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=patience)
    proc.wait()


@record
class SlurmStepSpec(TransportSpec):
    """A node of the run's allocation, reached by job steps (in the component of a heterogeneous
    job it belongs to, and in its container where pyxis holds one); it shares this machine's files."""

    KIND: ClassVar[str] = "slurm"
    SHARES_FILES: ClassVar[bool] = True
    job_id: str
    het_group: Optional[int] = None
    python: Optional[str] = None  # the cluster file's for the node: what relays a tunnel there
    container: List[str] = field(default_factory=list)  # the node's container (pyxis): its steps' srun options

    def connect(self, host: str, accept_new_host_keys: bool = False) -> Transport:
        return SlurmTransport(host, self.job_id, self.het_group, self.python, self.container)


SPEC = SlurmStepSpec  # what `transport.specs.read_spec` reads a stored spec of kind "slurm" as
