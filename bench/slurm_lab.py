"""A real Slurm on simulated hosts: slurmctld on this machine, one slurmd in each lab host.

Built on `bench.netns_hosts.TestHostLab` (each host its own network, hostname, pid and mount
namespace; all hosts share one home, as Slurm clusters share /home). What makes Slurm run there,
in a VM without systemd:

* `ip netns exec` remounts /sys, hiding the machine's cgroup mounts, so each host mounts the
  cgroup v1 hierarchies itself (a tmpfs on /sys/fs/cgroup, then one `cgroup` mount per
  controller); `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`.
* `SlurmctldHost` is this machine's hostname with the bridge address in parentheses, so the
  hosts reach slurmctld by address.
* One munged serves every host: its socket is a path, and paths are shared across network
  namespaces.

Client commands (sbatch, srun, squeue) find this Slurm through `env()` (SLURM_CONF). Every
process the lab starts is stopped by pid when it closes. Its daemons listen on ports derived from
the lab's subnet, so labs with distinct subnets run side by side.

`accounting=True` (off by default: it costs start-up time) adds Slurm's accounting as sites run
it: a private MariaDB (its own datadir and socket in the workdir, no TCP port; slurmdbd, running
as root, logs in through the socket), slurmdbd on it, the cluster registered with sacctmgr, and
`jobacct_gather/linux` (reads /proc: the lab tracks processes with linuxproc, not cgroups).
`AccountingStorageTRES=gres/gpu` records the stand-in GPUs, as GPU sites configure it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

from bench.netns_hosts import LabError, TestHost, TestHostLab
from bench.waiting import WaitTimeout, wait_until

BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "munged")
ACCOUNTING_BINARIES = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db")
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer")
CLUSTER = "tfctltest"


def missing_binaries(accounting: bool = False) -> list[str]:
    wanted = BINARIES + (ACCOUNTING_BINARIES if accounting else ())
    return [name for name in wanted if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}")]


URGENT = "urgent"  # a partition whose jobs take whole nodes, preempting (cancelling) debug's jobs there
GPUS_PER_NODE = 2  # stand-in GPUs (GRES) of each node of partition `gpu`


class SlurmLab:
    """`n` Slurm nodes named like the lab's hosts (tfh0...), partition `debug`, and `urgent` that
    preempts it; a context manager. For heterogeneous jobs the nodes are also split: partition
    `cpu` is the first node, `gpu` the others, each with `GPUS_PER_NODE` stand-in GPUs declared as
    GRES (character devices like /dev/null: Slurm hands them out and sets CUDA_VISIBLE_DEVICES)."""

    __test__ = False

    def __init__(self, workdir: Path, n: int = 3, accounting: bool = False, **lab_kwargs: object) -> None:
        self.workdir = workdir
        self.lab = TestHostLab(n, workdir=workdir / "hosts", shared_home=True, **lab_kwargs)  # type: ignore[arg-type]
        self.conf = workdir / "slurm.conf"
        self.accounting = accounting
        self.port = 20000 + 10 * int(self.lab.subnet.split(".")[-1])  # slurmctld's; slurmd +1, slurmdbd +2
        self.accounting_seconds = 0.0  # of the start-up, spent starting MariaDB and slurmdbd
        self.mariadb_data: Path | None = None
        self._procs: list[subprocess.Popen] = []
        self._names: dict[int, str] = {}  # pid -> the daemon, and where it runs

    @property
    def hosts(self) -> list[TestHost]:
        return self.lab.hosts

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmLab:
        self.lab.start()
        try:
            self._start_munge()
            self._write_conf()
            if self.accounting:
                started = time.monotonic()
                self._start_accounting()
                self.accounting_seconds = time.monotonic() - started
            self._start_daemons()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _spawn(
        self, argv: list[str], log: str, host: TestHost | None = None, env_extra: dict[str, str] | None = None
    ) -> subprocess.Popen:
        out = open(self.workdir / log, "ab")
        env = {**os.environ, **self.env(), **(env_extra or {})}
        if host is None:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        else:
            proc = host.popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        self._procs.append(proc)
        self._names[proc.pid] = argv[0] if host is None else f"{argv[0]} on {host.name}"
        return proc

    def _start_munge(self) -> None:
        munge = self.workdir / "munge"
        munge.mkdir()
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "munge.socket"
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'seed'}",
            ],
            "munged.out",
        )
        self._wait(lambda: self.munge_socket.exists(), "munged to create its socket")

    def _write_conf(self) -> None:
        w = self.workdir
        (w / "state").mkdir()
        gpu_nodes = [h.name for h in self.hosts[1:]]
        nodes = "\n".join(
            f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} CPUs=2 RealMemory=1000 State=UNKNOWN"
            + (f" Gres=gpu:{GPUS_PER_NODE}" if h.name in gpu_nodes else "")
            for h in self.hosts
        )
        partitions = f"PartitionName=cpu Nodes={self.hosts[0].name} MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
        if gpu_nodes:
            partitions += (
                f"\nPartitionName=gpu Nodes={','.join(gpu_nodes)} MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
            )
        self._write_gres(gpu_nodes)
        self.conf.write_text(
            f"""ClusterName={CLUSTER}
SlurmctldHost={socket.gethostname()}({self.lab.gateway})
SlurmctldPort={self.port}
SlurmdPort={self.port + 1}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
GresTypes=gpu
SlurmUser=root
SlurmdUser=root
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool/%n
SlurmctldPidFile={w}/slurmctld.pid
SlurmdPidFile={w}/slurmd.%n.pid
SlurmctldLogFile={w}/slurmctld.log
SlurmdLogFile={w}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
{self._accounting_conf()}
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmdTimeout=30
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4 PriorityTier=1
PartitionName={URGENT} Nodes=ALL MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE PriorityTier=2
{partitions}
"""
        )
        (w / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nCgroupMountpoint=/sys/fs/cgroup\n")

    def _accounting_conf(self) -> str:
        if not self.accounting:
            return "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none"
        return f"""AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={self.lab.gateway}
AccountingStoragePort={self.port + 2}
AccountingStoragePass={self.munge_socket}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux"""

    def _start_accounting(self) -> None:
        """MariaDB, then slurmdbd on it, then the cluster registered: before slurmctld, which
        then records every job from the first."""
        db = self.workdir / "mariadb"
        db.mkdir()
        self.mariadb_data = db / "data"
        self.mariadb_socket = db / "mysqld.sock"
        small = ["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=4M"]
        install = [
            *("mariadb-install-db", "--no-defaults", f"--datadir={self.mariadb_data}", "--user=root"),
            *("--skip-test-db", "--auth-root-authentication-method=socket", *small),
        ]
        done = subprocess.run(install, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise LabError(f"mariadb-install-db failed: {(done.stderr or done.stdout)[-800:]}")
        self._spawn(
            [
                *("mariadbd", "--no-defaults", "--user=root", f"--datadir={self.mariadb_data}"),
                *(f"--socket={self.mariadb_socket}", f"--pid-file={db / 'mariadbd.pid'}", "--skip-networking"),
                *("--skip-log-bin", *small),  # its log to stderr: mariadbd.out, shown when the lab fails
            ],
            "mariadbd.out",
        )
        self._wait(self.mariadb_socket.exists, "MariaDB to create its socket", timeout=60)
        w = self.workdir
        dbd_conf = os.open(w / "slurmdbd.conf", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # slurmdbd insists
        os.write(
            dbd_conf,
            f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdPort={self.port + 2}
SlurmUser=root
PidFile={w}/slurmdbd.pid
LogFile={w}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
""".encode(),
        )
        os.close(dbd_conf)
        # slurmdbd reads no MariaDB option file; its client library takes the socket from here.
        self._spawn(["slurmdbd", "-D"], "slurmdbd.out", env_extra={"MYSQL_UNIX_PORT": str(self.mariadb_socket)})
        self._wait(lambda: self.run(["sacctmgr", "--noheader", "list", "cluster"]).returncode == 0, "slurmdbd", 60)
        added = self.run(["sacctmgr", "--immediate", "add", "cluster", CLUSTER])
        if added.returncode != 0:
            raise LabError(f"sacctmgr add cluster failed: {added.stderr or added.stdout}")

    def _write_gres(self, gpu_nodes: list[str]) -> None:
        """gres.conf (beside slurm.conf, where slurmd looks): each GPU node's stand-in devices."""
        devices = self.workdir / "dev"
        devices.mkdir()
        for index in range(GPUS_PER_NODE):
            os.mknod(devices / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        files = f"{devices}/nvidia[0-{GPUS_PER_NODE - 1}]"
        lines = [f"NodeName={name} Name=gpu File={files}" for name in gpu_nodes]
        (self.workdir / "gres.conf").write_text("".join(line + "\n" for line in lines))

    def _start_daemons(self) -> None:
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        mounts = " && ".join(
            f"mkdir -p /sys/fs/cgroup/{c} && mount -t cgroup -o {c} none /sys/fs/cgroup/{c}" for c in CONTROLLERS
        )
        for host in self.hosts:
            done = host.exec(f"mount -t tmpfs none /sys/fs/cgroup && {mounts}")
            if done.returncode != 0:
                raise LabError(f"{host.name}: cannot mount cgroups: {done.stderr.strip()}")
            (self.workdir / "spool" / host.name).mkdir(parents=True)
            self._spawn(["slurmd", "-D", "-N", host.name, "-f", str(self.conf)], f"slurmd.{host.name}.out", host)
        self._wait(self._nodes_idle, "every slurmd to register", timeout=60)

    def _nodes_idle(self) -> bool:
        out = self.run(["sinfo", "--noheader", "--format=%t"]).stdout.split()
        return bool(out) and set(out) == {"idle"}

    def run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **self.env()}, **kw)  # type: ignore[call-overload]

    def jobs(self) -> list[str]:
        """Ids of every job Slurm still runs or queues."""
        return self.run(["squeue", "--noheader", "--format=%i"]).stdout.split()

    def steps(self) -> list[str]:
        return self.run(["squeue", "--steps", "--noheader", "--format=%i"]).stdout.split()

    def _wait(self, ready: Callable[[], object], what: str, timeout: float = 20.0) -> None:
        """Until `ready()`; fails at once if a daemon of the lab exits. Failures show the daemons' logs."""

        def check() -> object:
            if ready():
                return True
            dead = [self._names[p.pid] for p in self._procs if p.poll() is not None]
            if dead:
                raise LabError(f"waiting for {what} failed (exited: {dead})\n{self._logs()}")
            return False

        try:
            wait_until(check, timeout, what, interval=0.1)
        except WaitTimeout as e:
            raise LabError(f"waiting for {what} failed: {e}\n{self._logs()}") from None

    def _logs(self) -> str:
        return "\n".join(f"{p.name}: {p.read_text()[-800:]}" for p in self.workdir.glob("*.out"))

    def close(self) -> None:
        for job in self.jobs() if self.conf.exists() and self._procs else []:
            self.run(["scancel", job])
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()
        if self.mariadb_data is not None:
            shutil.rmtree(self.mariadb_data, ignore_errors=True)  # tens of MB; its log stays
        self.lab.close()
