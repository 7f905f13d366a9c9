"""Tasks in containers: each runtime's command lines, as argv lists (never a shell), in one
place, as peers of one interface (`Runtime`): podman, docker, apptainer.

A task's container has the host's network, the task's environment, its workdir and the run's
folder at the same paths, the user who started the run as its user, and `tether.py` as its
entrypoint: that passes signals on to the task and ends it when the task's monitor is gone (the
monitor holds a FIFO, bind-mounted in, open for as long as it lives). Containers are named and
labelled with their run, task and run store, so whatever escapes is found by label and removed
(`stop`, `reap`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
import time
from typing import IO, Callable, Dict, List, Optional, Sequence, Tuple

from . import procfs
from .errors import AgentError
from .files import RUN_DIR_ENV
from .protocol import ContainerLaunch, TaskLaunch

TETHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tether.py")
FIFO = "tether.fifo"  # in the task's directory: the monitor holds it open, the tether reads it
# In the task's directory: the tether writes the task's exit status there, for the monitor to
# record (a runtime's client may say another: podman's, stopped with --rm, says 0).
EXIT_FILE = "tether.exit"
RUN_LABEL = "tfctl.run"
TASK_LABEL = "tfctl.task"
STORE_LABEL = "tfctl.store"
AUTO_ORDER = ("podman", "docker", "apptainer")
CALL_TIMEOUT = 60.0  # a runtime command that takes longer than this is stuck
GPU_ENV = "CUDA_VISIBLE_DEVICES"
TARBALL_IMAGES = "localhost/tfctl-tarball"  # the name a loaded tarball's image is tagged with
# Lines docker prints after an error that say nothing of it: its help footers, and (at times,
# a race in its client) that waiting for the container that never started was cancelled.
NOT_THE_ERROR = re.compile(
    r"^(Run '.*--help' for more information|See '.*--help')\.?$"
    r"|^(ERRO\[\d+\] |time=\S+ level=error msg=\")[Ee]rror waiting for container: "
)


def is_tarball(image: str) -> bool:
    """An image tarball on the host (`podman save`, `docker save`), loaded in preflight."""
    return image.startswith("/") and image.endswith(".tar")


def tarball_tag(path: str) -> str:
    """The name a tarball's image has once loaded on this host: from the tarball's path, size
    and time, so tasks run what preflight loaded, and a tarball rewritten since loads again."""
    st = os.stat(path)
    key = "%s:%d:%d" % (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    return "%s:%s" % (TARBALL_IMAGES, hashlib.sha256(key.encode()).hexdigest()[:16])


class Container:
    """One task's container, as every runtime needs it described."""

    def __init__(
        self,
        name: str,
        spec: ContainerLaunch,
        env: Dict[str, str],
        cwd: str,
        mounts: Sequence[str],
        fifo: str,
        log: str,
        exit_file: str,
        grace: float,
        command: str,
        labels: Dict[str, str],
    ) -> None:
        self.name = name
        self.spec = spec
        self.env = env
        self.cwd = cwd
        self.mounts = [*("%s:%s" % (p, p) for p in mounts), "%s:%s:ro" % (TETHER, TETHER), *spec.mounts]
        self.fifo = fifo
        self.log = log
        self.exit_file = exit_file
        self.grace = grace
        self.command = command
        self.labels = labels

    def entry(self) -> List[str]:
        """What runs in the container: the tether, then the task's command through /bin/sh."""
        return [TETHER, self.fifo, self.log, self.exit_file, "%g" % self.grace, "/bin/sh", "-c", self.command]

    def gpus(self) -> Optional[List[str]]:
        """The task's GPUs as its host numbers them (None: it was given no GPUs of its own)."""
        given = self.env.get(GPU_ENV)
        return None if given is None else [g for g in given.split(",") if g.strip()]


class Runtime:
    """A container runtime, by its command lines; `exe` is its program's path."""

    name = ""
    gpu_fix = ""  # what a host needs for this runtime to give a container its GPUs

    def __init__(self, exe: str) -> None:
        self.exe = exe

    def run(self, c: Container) -> List[str]:
        """Run the task's container, attached: the command's end is the task's."""
        raise NotImplementedError

    def stop(self, name: str, grace: float) -> Optional[List[str]]:
        """SIGTERM, then SIGKILL after `grace`; None: the container is a process (signals do it)."""
        return None

    def remove(self, names: Sequence[str]) -> Optional[List[str]]:
        """Remove these containers, killing what still runs in them; None: nothing to remove."""
        return None

    def listing(self, label: str, value: Optional[str]) -> Optional[List[str]]:
        """Print the name and the run of every container with `label=value` (with `label`, for
        None), one a line."""
        return None

    def has_image(self, image: str) -> List[str]:
        """Succeeds when the image is on this host."""
        raise NotImplementedError

    def pull(self, image: str) -> Optional[List[str]]:
        """Fetch the image from its registry; None: not this runtime's way."""
        return None

    def load(self, tarball: str) -> Optional[List[str]]:
        """Load an image tarball, printing `Loaded image: NAME`; None: not this runtime's way."""
        return None

    def tag(self, image: str, name: str) -> List[str]:
        raise NotImplementedError

    def gpu_options(self, gpus: Sequence[str]) -> List[str]:
        """The options giving a container these GPUs, as its host numbers them (none: no option,
        the task is hidden from GPUs by an empty CUDA_VISIBLE_DEVICES alone)."""
        raise NotImplementedError

    def python(self, spec: ContainerLaunch, code: str, gpus: Sequence[str] = ()) -> List[str]:
        """The image's Python running `code`, for preflight, with these of the host's GPUs."""
        raise NotImplementedError


class Podman(Runtime):
    """podman: daemonless; `--rm` has conmon remove a container whose client was killed."""

    name = "podman"
    gpu_fix = (
        "podman gives a container GPUs by CDI: generate the host's spec with"
        " `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` (NVIDIA Container Toolkit)"
    )

    def run(self, c: Container) -> List[str]:
        # No --sig-proxy: a signal for the task reaches the tether, once (`procfs.to_signal`). No
        # log driver: the tether writes the task's output to its log itself.
        argv = [self.exe, "run", "--rm", "--sig-proxy=false", "--log-driver=none", "--name", c.name]
        argv += ["--network", "host", "--ipc", "host"]
        argv += self.user()
        argv += ["--label=%s=%s" % kv for kv in sorted(c.labels.items())]
        for mount in c.mounts:
            argv += ["--volume", mount]
        argv += ["--workdir", c.cwd, "--entrypoint", c.spec.python]
        gpus = c.gpus()
        env = dict(c.env)
        if gpus is not None:
            argv += self.gpu_options(gpus)
            env[GPU_ENV] = ",".join(str(i) for i in range(len(gpus)))  # renumbered from 0 inside
        for key, value in sorted(env.items()):
            argv += ["--env", "%s=%s" % (key, value)]
        argv += list(c.spec.options)
        argv += self.image(c.spec.image)
        return argv + c.entry()

    def user(self) -> List[str]:
        """Files the task writes belong to who started the run: root maps to root, and a user's
        rootless containers keep their id."""
        return [] if os.getuid() == 0 else ["--userns=keep-id"]

    def gpu_options(self, gpus: Sequence[str]) -> List[str]:
        return [a for g in gpus for a in ("--device", "nvidia.com/gpu=%s" % g)]

    def image(self, image: str) -> List[str]:
        """A tarball runs as the image it loaded; a rootfs folder (an absolute path) as it is."""
        if is_tarball(image):
            return [tarball_tag(image)]
        return ["--rootfs", image] if image.startswith("/") else [image]

    def pull(self, image: str) -> Optional[List[str]]:
        return [self.exe, "pull", image]

    def load(self, tarball: str) -> Optional[List[str]]:
        return [self.exe, "load", "--input", tarball]

    def tag(self, image: str, name: str) -> List[str]:
        return [self.exe, "tag", image, name]

    def stop(self, name: str, grace: float) -> Optional[List[str]]:
        return [self.exe, "stop", "--ignore", "--time", str(max(1, round(grace))), name]

    def remove(self, names: Sequence[str]) -> Optional[List[str]]:
        return [self.exe, "rm", "--force", "--ignore", *names] if names else None

    def listing(self, label: str, value: Optional[str]) -> Optional[List[str]]:
        fmt = '{{.Names}} {{index .Labels "%s"}}' % RUN_LABEL
        return [self.exe, "ps", "--all", "--filter", label_filter(label, value), "--format", fmt]

    def has_image(self, image: str) -> List[str]:
        if image.startswith("/") and not is_tarball(image):
            return ["test", "-d", image]
        return [self.exe, "image", "exists", *self.image(image)]

    def python(self, spec: ContainerLaunch, code: str, gpus: Sequence[str] = ()) -> List[str]:
        # The task's own mounts and options: its Python may come from one (a venv mounted in).
        volumes = [arg for mount in spec.mounts for arg in ("--volume", mount)]
        argv = [self.exe, "run", "--rm", "--network", "host", *volumes, "--entrypoint", spec.python]
        argv += self.gpu_options(gpus)
        return argv + list(spec.options) + self.image(spec.image) + ["-c", code]


class Docker(Podman):
    """docker: the daemon owns the container, so a killed client leaves it running; the
    tether ends it with its monitor, and `--rm` has the daemon remove it."""

    name = "docker"
    gpu_fix = (
        "docker gives a container GPUs through the NVIDIA Container Toolkit: install it, run"
        " `nvidia-ctk runtime configure --runtime=docker` and restart dockerd"
    )

    def user(self) -> List[str]:
        return ["--user", "%d:%d" % (os.getuid(), os.getgid())]

    def gpu_options(self, gpus: Sequence[str]) -> List[str]:
        if not gpus:
            return []  # `--gpus "device="` asks for a device named ""
        return ["--gpus", '"device=%s"' % ",".join(gpus)]  # quoted: docker reads the value as CSV

    def image(self, image: str) -> List[str]:
        if image.startswith("/") and not is_tarball(image):
            raise AgentError("docker cannot run a rootfs folder (%s): import it as an image" % image)
        return super().image(image)

    def stop(self, name: str, grace: float) -> Optional[List[str]]:
        return [self.exe, "stop", "--time", str(max(1, round(grace))), name]

    def remove(self, names: Sequence[str]) -> Optional[List[str]]:
        return [self.exe, "rm", "--force", *names] if names else None

    def has_image(self, image: str) -> List[str]:
        return [self.exe, "image", "inspect", "--format", "{{.Id}}", *self.image(image)]

    def listing(self, label: str, value: Optional[str]) -> Optional[List[str]]:
        fmt = '{{.Names}} {{.Label "%s"}}' % RUN_LABEL  # docker's .Labels is one string, not a map
        return [self.exe, "ps", "--all", "--filter", label_filter(label, value), "--format", fmt]


class Apptainer(Runtime):
    """apptainer: no daemon and no names; the container is the process tree of `apptainer exec`,
    in its own PID namespace (`--pid`), so it ends with it and signals stop it."""

    name = "apptainer"
    gpu_fix = "apptainer's --nv needs the NVIDIA driver's libraries on the host (ldconfig -p lists them)"

    def run(self, c: Container) -> List[str]:
        argv = [self.exe, "exec", "--pid", "--cleanenv", "--pwd", c.cwd]
        for mount in c.mounts:
            argv += ["--bind", mount]
        argv += self.gpu_options(c.gpus() or [])
        for key, value in sorted(c.env.items()):
            argv += ["--env", "%s=%s" % (key, value)]
        return argv + list(c.spec.options) + [c.spec.image, c.spec.python] + c.entry()

    def gpu_options(self, gpus: Sequence[str]) -> List[str]:
        return ["--nv"] if gpus else []  # all of the host's; CUDA_VISIBLE_DEVICES picks the task's

    def has_image(self, image: str) -> List[str]:
        return ["test", "-e", image]

    def python(self, spec: ContainerLaunch, code: str, gpus: Sequence[str] = ()) -> List[str]:
        binds = [arg for mount in spec.mounts for arg in ("--bind", mount)]
        nv = self.gpu_options(gpus)
        return [self.exe, "exec", "--cleanenv", *binds, *nv, *spec.options, spec.image, spec.python, "-c", code]


RUNTIMES = {cls.name: cls for cls in (Podman, Docker, Apptainer)}


def runtime(wanted: str) -> Runtime:
    """The runtime the task asks for (`auto`: the first of AUTO_ORDER this host has)."""
    for name in AUTO_ORDER if wanted == "auto" else (wanted,):
        exe = shutil.which(name)
        if exe is not None:
            return RUNTIMES[name](exe)
    wanted_text = " or ".join(AUTO_ORDER) if wanted == "auto" else wanted
    raise AgentError("no container runtime here: %s is not on PATH" % wanted_text)


def name_for(run_id: str, task: str) -> str:
    """`tfctl-<run>-<job>-<index>`: a name every runtime takes (letters, digits, `_.-`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", "tfctl-%s-%s" % (run_id, task))


def present() -> List[Runtime]:
    """The runtimes with containers to find on this host (apptainer keeps none)."""
    return [runtime(n) for n in ("podman", "docker") if shutil.which(n)]


def call(argv: Optional[List[str]], timeout: float = CALL_TIMEOUT) -> str:
    """Run a runtime command; its output ('' when it failed or there was nothing to run)."""
    if argv is None:
        return ""
    ok, out, _ = run(argv, timeout)
    return out if ok else ""


def run(argv: List[str], timeout: float = CALL_TIMEOUT) -> Tuple[bool, str, str]:
    """Run a runtime command: whether it succeeded, its output, its last line of errors."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, "", str(e)
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return done.returncode == 0, done.stdout.decode(errors="replace"), last_error(lines)


def last_error(lines: Sequence[str]) -> str:
    errors = [line for line in lines if line.strip() and not NOT_THE_ERROR.match(line)]
    return errors[-1] if errors else ""


def run_telling(argv: List[str], timeout: float, note: Callable[[str], None]) -> Tuple[bool, str, str]:
    """`run`, with each line the command prints said as it comes (`note`): a pull's progress,
    which podman prints on stderr and docker on stdout."""
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        return False, "", str(e)
    said: Dict[str, List[str]] = {"out": [], "err": []}

    def read(stream: IO[bytes], kept: List[str]) -> None:
        for raw in iter(stream.readline, b""):
            kept.append(raw.decode(errors="replace").rstrip("\r\n"))
            note(kept[-1])

    assert child.stdout is not None and child.stderr is not None
    readers = [
        threading.Thread(target=read, args=(child.stdout, said["out"]), daemon=True),
        threading.Thread(target=read, args=(child.stderr, said["err"]), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return False, "", "timed out after %gs" % timeout
    finally:
        for reader in readers:
            reader.join(CALL_TIMEOUT)
    return child.returncode == 0, "".join(line + "\n" for line in said["out"]), last_error(said["err"])


# argv: the modules to look for; prints those the image lacks last.
PROBE = """
import sys
print(sys.version.split()[0])
print(sys.executable)
try:
    import tensorflow
    print("tensorflow " + tensorflow.__version__)  # as a bare host's answer says it
except Exception as e:
    print("")
import importlib.util
print(",".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
"""
PROBE_TIMEOUT = 50.0  # a TensorFlow import in a cold container takes seconds


def probe(
    spec: ContainerLaunch,
    gpus: Sequence[str] = (),
    note: Callable[[str], None] = lambda _line: None,
    modules: Sequence[str] = (),
) -> Tuple[str, str, List[str], Optional[str]]:
    """Preflight of a task's container, given `gpus` (the host's, where tasks ask for some):
    (what it ran in, how its image came, the image Python's version, executable, TensorFlow
    version and which of `modules` it lacks, why it cannot run there). A pull's progress is
    said (`note`) as it comes."""
    absent = [source for source in (m.split(":")[0] for m in spec.mounts) if not os.path.exists(source)]
    if absent:
        return "", "", [], "container.mounts: %s does not exist on this host (podman and docker refuse it)" % absent[0]
    try:
        rt = runtime(spec.runtime)
        fetched = fetch(rt, spec, note)
        where = "%s image %s" % (rt.name, spec.image)
        ok, out, error = run(rt.python(spec, PROBE, gpus) + list(modules), PROBE_TIMEOUT)
        if not ok and gpus and run(rt.python(spec, PROBE) + list(modules), PROBE_TIMEOUT)[0]:
            why = "%s cannot give a container the host's GPUs (%s); %s" % (rt.name, error or "failed", rt.gpu_fix)
            return where, fetched, [], why
    except (AgentError, OSError) as e:
        return "", "", [], str(e)
    if not ok:
        why = "the image's %s does not run: %s%s" % (spec.python, error or "failed", unmounted(spec))
        return where, fetched, [], why
    return where, fetched, out.splitlines(), None


def unmounted(spec: ContainerLaunch) -> str:
    """Why an image's Python may not run: it names one of this host's (a virtualenv) that no
    mount brings into the container."""
    python = spec.python
    if not python.startswith("/") or not os.path.exists(python):
        return ""
    inside = [m.split(":")[1] for m in spec.mounts]
    if any(python == d or python.startswith(d.rstrip("/") + "/") for d in inside):
        return ""
    folder = os.path.dirname(os.path.dirname(python))
    return "; %s is this host's, not the image's: mount its folder (container.mounts: [%s:%s:ro])" % (
        python,
        folder,
        folder,
    )


def fetch(rt: Runtime, spec: ContainerLaunch, note: Callable[[str], None] = lambda _line: None) -> str:
    """Have the image on this host: load its tarball, or pull it, within `spec.pull_timeout`,
    saying (`note`) each line the runtime prints meanwhile; what was done ('' when it was
    there). Raises AgentError when it cannot be had."""
    image = spec.image
    if is_tarball(image) and not os.path.isfile(image):
        raise AgentError("image tarball %s is not on this host" % image)
    if run(rt.has_image(image))[0]:
        return ""
    began = time.monotonic()
    fetching = rt.load(image) if is_tarball(image) else None if image.startswith("/") else rt.pull(image)
    if fetching is None:
        raise AgentError("image %s is not on this host (%s pull it, or load its tarball)" % (image, rt.name))
    ok, out, error = run_telling(fetching, spec.pull_timeout, note)
    took = time.monotonic() - began
    verb = "loading" if is_tarball(image) else "pulling"
    if not ok and took >= spec.pull_timeout:
        raise AgentError("%s image %s took more than %gs (container.pull_timeout)" % (verb, image, spec.pull_timeout))
    if not ok:
        raise AgentError("image %s is not on this host, and %s it failed: %s" % (image, verb, error or "?"))
    if not is_tarball(image):
        return "pulled %s in %.1fs" % (image, took)
    loaded = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Loaded image")]
    names = loaded[-1].split(",") if loaded else []
    if not names or not run(rt.tag(names[0].strip(), tarball_tag(image)))[0]:
        raise AgentError("loading image tarball %s named no image: %s" % (image, out.strip() or error))
    return "loaded %s from %s in %.1fs" % (names[0].strip(), image, took)


Found = Tuple[Runtime, str, str]  # a container: its runtime, its name, its run


def label_filter(label: str, value: Optional[str]) -> str:
    return "label=%s" % label if value is None else "label=%s=%s" % (label, value)


def labelled(label: str, value: Optional[str] = None) -> List[Found]:
    """Every container here with `label=value` (with `label` at all, for None)."""
    found: List[Found] = []
    for rt in present():
        for line in call(rt.listing(label, value)).splitlines():
            name, _, run = line.partition(" ")
            if name:
                found.append((rt, name, run))
    return found


def remove(found: Sequence[Found]) -> None:
    """Remove these containers (as `labelled` found them), killing what still runs in them."""
    for rt in {rt.exe: rt for rt, _, _ in found}.values():
        call(rt.remove([name for other, name, _ in found if other.exe == rt.exe]))


class Tethered:
    """A task's container as its monitor holds it: the FIFO that ties the container to the
    monitor's life (opened here, held until the monitor exits) and the runtime commands."""

    def __init__(self, d: str, run_id: str, launch: TaskLaunch, env: Dict[str, str], command: str) -> None:
        assert launch.container is not None
        if not os.path.isfile(TETHER):
            raise AgentError("the supervisor runs from its zip (%s): its container entrypoint is not a file" % TETHER)
        self.runtime = runtime(launch.container.runtime)
        self.run_id, self.task = run_id, launch.task
        self.name = name_for(run_id, launch.task)
        fifo = os.path.join(d, FIFO)
        if not os.path.exists(fifo):
            os.mkfifo(fifo, 0o600)
        self.tie = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)  # never closed: its end is the monitor's
        cwd = os.path.expanduser(launch.cwd or "~")
        log = os.path.join(d, "output.log")
        self.exit_file = os.path.join(d, EXIT_FILE)
        self.forget_exit()
        shared = sorted({cwd, env.get(RUN_DIR_ENV, cwd), fifo, log, self.exit_file})
        labels = {RUN_LABEL: run_id, TASK_LABEL: launch.task, STORE_LABEL: launch.store}
        self.container = Container(
            self.name, launch.container, env, cwd, shared, fifo, log, self.exit_file, launch.grace, command, labels
        )
        self.argv = self.runtime.run(self.container)
        self.root: Optional[int] = None  # the host pid of the container's first process, once seen

    def forget_exit(self) -> None:
        """Before each run of the task: no status yet (the file is there, to be mounted)."""
        os.close(os.open(self.exit_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))

    def exit_code(self, client: int, patience: float) -> int:
        """The task's exit status as the tether wrote it. A stop signals the runtime's client
        and the container's processes alike: the client may be gone while the tether still ends
        the task (a chief saving), so it is waited for while they run, `patience` seconds at
        most. The client's status, `client`, when the tether wrote none (killed, or never ran)."""
        deadline = time.monotonic() + patience
        while True:
            written = self._written()
            if written is not None:
                return written
            if time.monotonic() > deadline or not procfs.task_processes(self.run_id, self.task, None):
                written = self._written()  # (it may have written it as it ended, after the read above)
                return client if written is None else written
            time.sleep(procfs.POLL)

    def _written(self) -> Optional[int]:
        """What the tether wrote, if it has (an empty file: not yet)."""
        try:
            with open(self.exit_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        call(self.runtime.stop(self.name, self.container.grace))

    def remove(self) -> None:
        call(self.runtime.remove([self.name]))
