"""Container runtimes of the suite's own, and a small image with no registry (Debian's essential
packages, python3-minimal and its standard library, by mmdebstrap) imported into each.

podman is configured through CONTAINERS_CONF and CONTAINERS_STORAGE_CONF alone, never the
machine's files: runc (crun refuses these cgroup v1 machines: "cgroups in hybrid mode not
supported"), cgroupfs, and ulimits within the hard limits (podman's default nofile is above them
here). docker is a dockerd of the suite's, on its own socket (DOCKER_HOST) and data folder,
stopped by its PID. On a simulated host (bench/netns_hosts.py) each runtime is the host's own:
its podman's storage, or a dockerd started in the host's namespaces (`--network host` joins the
dockerd's network namespace, so a host's containers need a dockerd of the host's).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable

from bench.netns_hosts import TestHost
from tfctl.supervisor import containers
from tfctl.supervisor.procfs import live_pids, proc_cmdline, proc_env_markers, proc_stat

IMAGE = "localhost/tfctl-test:py3"
NEEDED = {
    "podman": ("podman", "runc", "mmdebstrap"),
    "docker": ("dockerd", "docker", "mmdebstrap"),
    "registry": ("docker-registry",),
}
PACKAGES = {"podman": "podman runc mmdebstrap", "docker": "docker.io mmdebstrap", "registry": "docker-registry"}


def skip_reason(runtime: str) -> str | None:
    """Why the runtime's lab cannot run here, or None."""
    if os.geteuid() != 0:
        return f"the {runtime} lab needs root (mmdebstrap and a rootful {runtime})"
    missing = [tool for tool in NEEDED[runtime] if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install {PACKAGES[runtime]}"
    return None


def build_rootfs(tarball: Path) -> float:
    """The image's root filesystem as a tarball; the seconds it took."""
    began = time.monotonic()
    subprocess.run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=essential",
            # libstdc++6 and zlib1g: what TensorFlow's wheels load, for a venv of the same Python mounted in
            "--include=python3-minimal,libpython3.11-stdlib,libstdc++6,zlib1g",
            "bookworm",
            str(tarball),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return time.monotonic() - began


class Lab:
    """A runtime's command line with the lab's settings, and what the tests ask of it."""

    name = ""  # the runtime's, as `container.runtime` names it

    def __init__(self, base: Path, env: dict[str, str], argv: list[str]) -> None:
        self.base = base
        self.env = env  # what every supervisor the tests start needs to reach this runtime
        self.argv = argv

    def cli(self, *args: str, timeout: float = 120) -> str:
        """The runtime's command with the lab's configuration; its output."""
        done = subprocess.run(
            [*self.argv, *args], env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(self.argv[:1])} {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def containers(self, label: str) -> list[str]:
        """Names of every container (running or not) with this label."""
        return self.cli("ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}").split()

    def start(self, tarball: Path) -> None:
        """Start the runtime with the image made from `tarball`."""
        raise NotImplementedError

    def tear_down(self) -> None:
        """Remove every container and image of the lab, then its files."""
        raise NotImplementedError

    def remove_files(self, *more: Path) -> None:
        """The lab's folder (and `more`), after what the runtime left mounted there (dockerd: its
        netns/default; podman: the containers' shm in its runroot)."""
        for folder in (self.base, *more):
            for mount in mounts_under(folder):
                subprocess.run(["umount", mount], capture_output=True)
            shutil.rmtree(folder, ignore_errors=True)


class PodmanLab(Lab):
    name = "podman"

    def __init__(self, base: Path) -> None:
        self.graph = base / "storage"
        # podman refuses a runroot longer than 50 characters (pytest -n's folders are longer)
        self.runroot = Path(tempfile.gettempdir()) / f"tfctl-podrun-{hashlib.sha1(bytes(base)).hexdigest()[:12]}"
        env = {"CONTAINERS_CONF": str(base / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(base / "storage.conf")}
        super().__init__(base, env, ["podman", "--root", str(self.graph), "--runroot", str(self.runroot)])

    def start(self, tarball: Path) -> None:
        """Write the configuration and import the image."""
        self.base.mkdir(parents=True, exist_ok=True)
        _soft, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
        nproc = 4096 if nproc == resource.RLIM_INFINITY else min(nproc, 4096)
        (self.base / "containers.conf").write_text(
            "[containers]\n"
            f'default_ulimits = ["nofile=1024:1024", "nproc={nproc}:{nproc}"]\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'runtime = "runc"\n'
            'events_logger = "file"\n'
            f'tmp_dir = "{self.base / "tmp"}"\n'
        )
        (self.base / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{self.graph}"\nrunroot = "{self.runroot}"\n'
        )
        self.cli("import", str(tarball), IMAGE)

    def tear_down(self) -> None:
        """Remove every container and image of the lab, then its files."""
        try:
            self.cli("rm", "--all", "--force")
            self.cli("rmi", "--all", "--force")
        finally:
            self.remove_files(self.runroot)


class HostPodmanLab(PodmanLab):
    """The podman of one simulated host (bench/netns_hosts.py), with its own configuration and
    storage: run inside the host, and given to its SSH sessions through `session_env` (the host
    name in place of `{host}`), so its supervisor's podman is this one."""

    def __init__(self, base: Path, host: TestHost) -> None:
        super().__init__(base / host.name)
        self.host = host
        self.argv = host.inside(self.argv)

    def start(self, tarball: Path) -> None:
        mount_cgroups(self.host)
        super().start(tarball)

    @staticmethod
    def session_env(base: Path) -> dict[str, str]:
        """What every host's SSH sessions need to reach its own podman, for `TestHostLab`."""
        return {key: str(base / "{host}" / Path(value).name) for key, value in PodmanLab(base).env.items()}


class DockerLab(Lab):
    name = "docker"

    def __init__(self, base: Path) -> None:
        self.socket = base / "docker.sock"
        super().__init__(base, {"DOCKER_HOST": f"unix://{self.socket}"}, ["docker"])
        self.daemon: subprocess.Popen | None = None

    def start(self, tarball: Path) -> None:
        """Start the lab's dockerd and import the image."""
        self.base.mkdir(parents=True, exist_ok=True)
        log = open(self.base / "dockerd.log", "wb")
        self.daemon = subprocess.Popen(self.daemon_argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env={**os.environ, **self.env}, capture_output=True).returncode:
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: see {self.base / 'dockerd.log'}")
            time.sleep(0.2)
        self.cli("import", str(tarball), IMAGE)

    def daemon_argv(self) -> list[str]:
        return [
            "dockerd",
            "--data-root",
            str(self.base / "data"),
            "--exec-root",
            str(self.base / "exec"),
            "--pidfile",
            str(self.base / "dockerd.pid"),
            "--host",
            self.env["DOCKER_HOST"],
            "--iptables=false",
            "--bridge=none",
        ]

    def tear_down(self) -> None:
        """Remove every container of the lab, stop its dockerd (and so its containerd), then its files."""
        try:
            names = self.cli("ps", "--all", "--format", "{{.Names}}").split()
            if names:
                self.cli("rm", "--force", *names)
        finally:
            if self.daemon is not None:
                # dockerd waits up to 15 s for its containerd on SIGTERM: with no container left,
                # both (one process group, started as its own session) are killed after a moment.
                # The group, as the daemon may be `nsenter`'s child (HostDockerLab).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.daemon.pid, signal.SIGTERM)
                try:
                    self.daemon.wait(3)
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(self.daemon.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.daemon.wait()
            self.remove_files()


class HostDockerLab(DockerLab):
    """The dockerd of one simulated host, started in the host's namespaces (by `nsenter`, in
    the daemon's process group), so `docker run --network host` runs on the host's network;
    its socket reaches the host's SSH sessions through `session_env`."""

    def __init__(self, base: Path, host: TestHost) -> None:
        super().__init__(base / host.name)
        self.host = host

    def start(self, tarball: Path) -> None:
        mount_cgroups(self.host)
        super().start(tarball)

    def daemon_argv(self) -> list[str]:
        return self.host.inside(super().daemon_argv())

    def remove_files(self, *more: Path) -> None:
        """What dockerd left mounted lives in the host's mount namespace: unmounted there."""
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{self.host.init_pid}/mounts") as f:
            for point in below(self.base, f):  # (none to see once the host is gone)
                self.host.exec(["umount", point])
        super().remove_files(*more)

    @staticmethod
    def session_env(base: Path) -> dict[str, str]:
        """What every host's SSH sessions need to reach its own dockerd, for `TestHostLab`."""
        return {"DOCKER_HOST": f"unix://{base}/{{host}}/docker.sock"}


class Registry:
    """Debian's docker-registry on a loopback port, with its own storage and configuration,
    and a registries.conf (CONTAINERS_REGISTRIES_CONF) that lets podman use it without TLS;
    stopped by its PID."""

    def __init__(self, base: Path, port: int) -> None:
        self.base = base
        self.address = f"127.0.0.1:{port}"
        self.env = {"CONTAINERS_REGISTRIES_CONF": str(base / "registries.conf")}
        self.server: subprocess.Popen | None = None

    def __enter__(self) -> "Registry":
        self.base.mkdir(parents=True, exist_ok=True)
        config = self.base / "config.yml"
        config.write_text(
            f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {self.base / 'data'}\n"
            f"http:\n  addr: {self.address}\n"
        )
        (self.base / "registries.conf").write_text(f'[[registry]]\nlocation = "{self.address}"\ninsecure = true\n')
        log = open(self.base / "registry.log", "wb")
        self.server = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not listening(self.address):
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"docker-registry did not start: see {self.base / 'registry.log'}")
            time.sleep(0.1)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def cgroup_mounts() -> list[str]:
    """Shell commands that mount this machine's cgroup hierarchies again, at the same places."""
    commands: list[str] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point, kind = fields[4], fields[fields.index("-") + 1]
            if point == "/sys/fs/cgroup" and kind == "tmpfs":
                commands.insert(0, "mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup")
            elif kind in ("cgroup", "cgroup2") and point.startswith("/sys/fs/cgroup/"):
                options = fields[fields.index("-") + 3]
                commands.append(f"mkdir -p {point}; mount -t {kind} -o {options} {kind} {point}")
    return commands


def mount_cgroups(host: TestHost) -> None:
    """The machine's cgroup hierarchies mounted in the host, once: `ip netns exec` gave it a
    /sys of its own, without them, where runc finds no cgroup to put a container in."""
    commands = "; ".join(cgroup_mounts())
    host.exec(["sh", "-c", f"set -e; mountpoint -q /sys/fs/cgroup || {{ {commands}; }}"], check=True)


def host_tree(host: TestHost) -> list[int]:
    """Root-namespace pids of the host's processes and of their descendants, its containers'
    processes among them (each container has a PID namespace of its own, below the host's)."""
    children: dict[int, list[int]] = {}
    for pid in live_pids():
        stat = proc_stat(pid)
        if stat is not None:
            children.setdefault(stat["ppid"], []).append(pid)
    found = set(host.pids())
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def freeze(host: TestHost) -> set[int]:
    """SIGSTOP every process of the host, its containers' among them, as a paused VM would be
    frozen (again until none was forked meanwhile); the pids stopped, for `thaw`."""
    frozen: set[int] = set()
    while not frozen.issuperset(now := host_tree(host)):
        for pid in set(now) - frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= set(now)
    return frozen


def thaw(frozen: Iterable[int]) -> None:
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def run_processes(run_id: str) -> list[int]:
    """Every live process of the run, whatever its namespace: its tasks and tethers (by their
    markers), the runtime clients and conmons of its containers (by the containers' names)."""
    name = containers.name_for(run_id, "")
    return [p for p in live_pids() if proc_env_markers(p)[0] == run_id or name in proc_cmdline(p)]


def mounts_under(base: Path) -> list[str]:
    """Mount points below `base`, deepest first."""
    with open("/proc/mounts") as f:
        return below(base, f)


def below(base: Path, mounts: Iterable[str]) -> list[str]:
    """The mount points of a mount table's lines that lie below `base`, deepest first."""
    points = [line.split()[1] for line in mounts]
    return sorted((p for p in points if p.startswith(f"{base}/")), key=len, reverse=True)
