"""What preflight and diagnosis ask a host: its Python and TensorFlow, ports, and reachability."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Set

from . import containers, devices, notes
from .distinfo import dist_version
from .ports import hold
from .procfs import listening_sockets, proc_cmdline, socket_owners
from .protocol import (
    ContainerLaunch,
    InfoAnswer,
    InfoRequest,
    ListenAnswer,
    ListenRequest,
    PortInfo,
    PortsAnswer,
    PortsRequest,
    ProbeAnswer,
    ProbeRequest,
    ProbeResult,
)
from .records import Record, record
from .sync import filesystem_token

TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-macos")

# Run by the tasks' interpreter when it is not the supervisor's own: with `site`, as a task runs.
# argv: this supervisor's directory (or zip), the distributions to look for (comma-separated),
# then the modules to look for; prints the modules it lacks last.
VERSION_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
found = ""
try:
    from tfctl_supervisor.distinfo import dist_version
    found = dist_version(sys.argv[2].split(","), sys.path[1:]) or ""
except Exception:
    pass
print(sys.version.split()[0])
print(sys.executable)
print(found)
del sys.path[0]
import importlib.util
print(",".join(m for m in sys.argv[3:] if importlib.util.find_spec(m) is None))
"""
SUPERVISOR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # at import, before a cwd change

LISTENER = """
import socket, sys, time
socks = []
for port in sys.argv[2:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(port)))
    s.listen(64)
    socks.append(s)
print("listening", flush=True)
time.sleep(float(sys.argv[1]))
"""


@record
class VirtualEnv(Record):
    prefix: str
    system_site_packages: bool


def virtualenv(executable: str) -> Optional[VirtualEnv]:
    """The virtualenv an interpreter path belongs to, found as `site.venv()` finds it: by the
    pyvenv.cfg next to the executable or one directory up."""
    exe_dir = os.path.dirname(os.path.abspath(executable))
    prefix = os.path.dirname(exe_dir)
    for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(prefix, "pyvenv.cfg")):
        try:
            with open(conf) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        system = any(
            key.strip().lower() == "include-system-site-packages" and value.strip().lower() == "true"
            for key, _, value in (line.partition("=") for line in lines)
        )
        return VirtualEnv(os.path.realpath(prefix), system)
    return None


def same_interpreter(python: str, executable: str) -> bool:
    """Whether `python` sees the packages `executable` sees. A venv's python is a symlink to its
    base interpreter: the same binary with other packages, so the venv must match too."""
    same_binary = os.path.realpath(python) == os.path.realpath(executable)
    return same_binary and virtualenv(python) == virtualenv(executable)


def site_packages() -> List[str]:
    """Where this interpreter's tasks find packages. The supervisor runs with `-S`, so `site`
    never switched to a virtualenv's prefix (on Debian a venv's sys.prefix then stays the base
    interpreter's): the venv's site-packages come from its pyvenv.cfg instead, as in `site.venv()`."""
    import site

    system = site.getsitepackages() + [site.getusersitepackages()]
    venv = virtualenv(sys.executable)
    if venv is None:
        return system
    own = [os.path.join(venv.prefix, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")]
    own += site.getsitepackages([venv.prefix])  # Debian's dist-packages layout, should a venv use it
    return own + (system if venv.system_site_packages else [])


def with_pth_paths(dirs: List[str]) -> List[str]:
    """`dirs` and the directories their .pth files add, as `site` adds them for a task (a layered
    environment, `pip install -e`, conda-style setups): each line not a comment nor an `import`,
    relative to its site directory, if it exists. The supervisor runs with `-S`, so no .pth was read."""
    out = list(dirs)
    for site_dir in dirs:
        try:
            names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(site_dir, name), encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.rstrip()
                if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
                    continue
                path = os.path.normpath(os.path.join(site_dir, line))
                if path not in out and os.path.isdir(path):
                    out.append(path)
    return out


def tasks_path() -> List[str]:
    """Where this interpreter's tasks look for packages: the supervisor runs with `-S`, so its own
    sys.path lacks site-packages and what their .pth files add."""
    return list(sys.path) + with_pth_paths(site_packages())


def package_version(names: Sequence[str], path: List[str]) -> Optional[str]:
    """An installed distribution's version from its metadata in `path` (`tasks_path`): no
    import, so no 3-second TF start."""
    return dist_version(names, path)


def info(root: str, request: InfoRequest) -> InfoAnswer:
    """What preflight compares across hosts and places tasks on: who we are, which Python and
    TensorFlow run tasks, the cores and (when asked) the GPUs, and which hosts share our home."""
    found, error = devices.gpus() if request.gpus else ([], None)
    if request.container is None:
        asked = python_info(request.python, request.modules)
    else:
        asked = container_info(request.container, [str(g.index) for g in found], request.modules)
    return asked.replace(cpus=devices.cpu_cores(), gpus=found, gpu_error=error, filesystem=filesystem_token(root))


def python_info(asked: Optional[str], modules: Sequence[str] = ()) -> InfoAnswer:
    """Who we are, which Python and TensorFlow the interpreter `asked` (default: ours) has, and
    which of `modules` it lacks."""
    hostname, own_version = socket.gethostname(), sys.version.split()[0]
    asked = asked or sys.executable
    python = shutil.which(asked) or asked
    if same_interpreter(python, sys.executable):
        path = tasks_path()
        return InfoAnswer(
            hostname,
            own_version,
            own_version,
            package_version(TF_DISTRIBUTIONS, path),
            python_executable=sys.executable,
            missing_modules=own_missing(modules, path),
        )
    # The tasks' interpreter, with its site-packages, is asked in a process of its own.
    argv = [python, "-c", VERSION_PROBE, SUPERVISOR, ",".join(TF_DISTRIBUTIONS), *modules]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return InfoAnswer(hostname, own_version, python_error=str(e))
    lines = done.stdout.decode(errors="replace").splitlines()
    if done.returncode != 0 or len(lines) < 2:
        error = (done.stderr.decode(errors="replace").strip().splitlines() or ["failed"])[-1]
        return InfoAnswer(hostname, own_version, python_error=error)
    return InfoAnswer(
        hostname,
        own_version,
        lines[0],
        (lines[2] if len(lines) > 2 else "") or None,
        python_executable=lines[1],
        missing_modules=missing_line(lines, 3),
    )


def own_missing(modules: Sequence[str], path: List[str]) -> List[str]:
    """Of `modules`, those this interpreter's tasks cannot import from `path` (`tasks_path`)."""
    from importlib.machinery import PathFinder

    return [m for m in modules if m not in sys.builtin_module_names and PathFinder.find_spec(m, path) is None]


def missing_line(lines: Sequence[str], at: int) -> List[str]:
    """A probe's comma-separated line of the modules it lacks."""
    return [m for m in lines[at].split(",") if m] if len(lines) > at else []


def container_info(spec: ContainerLaunch, gpus: Sequence[str], modules: Sequence[str] = ()) -> InfoAnswer:
    """Who we are, which Python and TensorFlow the tasks' image has (given the host's `gpus`) and
    which of `modules` it lacks, or why they cannot run in it."""
    hostname, own_version = socket.gethostname(), sys.version.split()[0]
    where, fetched, lines, error = containers.probe(spec, gpus, notes.say, modules)  # a pull's lines reach `up`
    if error is not None or len(lines) < 2:
        return InfoAnswer(hostname, own_version, container=where, container_error=error or "no answer from the image")
    tf = (lines[2] if len(lines) > 2 else "") or None
    return InfoAnswer(
        hostname,
        own_version,
        lines[0],
        tf,
        python_executable=lines[1],
        container=where,
        container_fetched=fetched,
        missing_modules=missing_line(lines, 3),
    )


def local_addresses() -> Set[str]:
    """Addresses of this host (for "the name resolves to this very host" diagnoses)."""
    found = {"127.0.0.1", "::1"}
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if "/32 host LOCAL" in line and i > 0:
                found.add(lines[i - 1].split()[-1])
    except OSError:
        pass
    return found


def probe(root: str, request: ProbeRequest) -> ProbeAnswer:
    """TCP connect from this host to each target: what a task here would see reaching its peers."""
    mine = local_addresses()
    return ProbeAnswer({target: connect(target, request.timeout, mine) for target in request.targets})


def connect(target: str, timeout: float, mine: Set[str]) -> ProbeResult:
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return ProbeResult(False, "unresolvable", detail=str(e))
    family, kind, proto, _, sockaddr = infos[0]
    address = str(sockaddr[0])
    local = address in mine or address.startswith("127.")
    sock = socket.socket(family, kind, proto)
    sock.settimeout(timeout)
    try:
        sock.connect(sockaddr)
        return ProbeResult(True, address=address, local=local)
    except socket.timeout:
        return ProbeResult(False, "timeout", address, local)
    except ConnectionRefusedError:
        return ProbeResult(False, "refused", address, local)
    except OSError as e:
        return ProbeResult(False, "unreachable", address, local, e.strerror or str(e))
    finally:
        sock.close()


def listen(root: str, request: ListenRequest) -> ListenAnswer:
    """Hold the given ports open for a while (marked with `run_id`, stopped with `stop`), so the
    network between hosts can be checked before any TensorFlow task exists."""
    pid, _ = hold(
        LISTENER,
        [str(request.seconds)] + [str(p) for p in request.ports],
        request.run_id,
        request.store,
        "listening",
        "cannot listen on ports %s" % request.ports,
    )
    return ListenAnswer(pid)


def port_owners(ports: List[int]) -> Dict[str, PortInfo]:
    """Which of the given ports something listens on, and who (by str(port))."""
    listening = listening_sockets()
    out = {}
    for port in ports:
        if port in listening:
            owners = socket_owners(listening[port])
            out[str(port)] = PortInfo(True, owners, proc_cmdline(owners[0]) if owners else "")
        else:
            out[str(port)] = PortInfo(False)
    return out


def ports(root: str, request: PortsRequest) -> PortsAnswer:
    return PortsAnswer(port_owners(request.ports))
