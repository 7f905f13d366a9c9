"""tfctl host supervisor: the only tfctl code that runs on cluster hosts.

Stdlib only, Python >= 3.8, one file: tfctl copies it to a host (or runs it in place for
localhost) and calls `python3 agent.py VERB` with a JSON request on stdin. Every verb but
`follow` answers with one JSON object on stdout; `follow` streams JSON lines.

Each task runs under a small monitor process (`_monitor`), in its own session and process group,
detached from the controller, so it survives the controller or its SSH channel going away. The
monitor records pid, process group and the kernel start time (so a reused pid is never taken for
the task) and, when the task ends on its own, its exit code; then it kills whatever the task left
behind in its group. Every task process carries TFCTL_RUN_ID and TFCTL_TASK in its environment, so
stragglers that left the group (daemons, `setsid` children) are still found by `stop`/`sweep`.

Host layout: <root>/tasks/<run_id>/<job>-<index>/{spec.json, proc.json, exit.json, stop.json,
output.log, monitor.log}.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

RUN_ENV = "TFCTL_RUN_ID"
TASK_ENV = "TFCTL_TASK"
STORE_ENV = "TFCTL_STORE"  # which controller's run store started the process: sweeps touch only their own
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-macos")
POLL = 0.05
CHUNK = 256 * 1024
MAX_PARTIAL_LINE = 64 * 1024
HEARTBEAT = 5.0


class AgentError(Exception):
    """A request that cannot be served; reported as {"error": ...} with exit code 1."""


# ---------------------------------------------------------------- files


def write_json(path: str, data: dict) -> None:
    """Atomic write: readers see the old file or the new one, never half of it."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def run_dir(root: str, run_id: str) -> str:
    return os.path.join(os.path.expanduser(root), "tasks", run_id)


def task_dir(root: str, run_id: str, task: str) -> str:
    return os.path.join(run_dir(root, run_id), task.replace(":", "-"))


# ---------------------------------------------------------------- processes

SHELL_WORDS = {"if", "for", "while", "until", "case", "{", "!", "cd", "export", "set", "exec", "time", "."}


def exec_form(command: str) -> str:
    """`exec COMMAND` when COMMAND is one simple command, so the task's pid is the program's own
    (dash does not exec the last command) and its exit signal is reported as a signal."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return command
    if not tokens or "\n" in command or any(set(t) <= set(";&|()") for t in tokens):
        return command
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]) or tokens[0] in SHELL_WORDS:
        return command
    return "exec " + command



def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> dict | None:
    """pid's ppid, pgid, sid, state and start time (clock ticks since boot), or None if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rsplit(")", 1)[1].split()
    return {
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "starttime": int(fields[19]),
    }


def proc_markers(pid: int) -> dict:
    """tfctl's markers (TFCTL_RUN_ID, TFCTL_TASK, TFCTL_STORE) in pid's environment, read once."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read()
    except OSError:
        return {}
    found = {}
    for item in env.split(b"\0"):
        if item.startswith(b"TFCTL_"):
            name, _, value = item.partition(b"=")
            if name.decode(errors="replace") in (RUN_ENV, TASK_ENV, STORE_ENV):
                found[name.decode()] = value.decode(errors="replace")
    return found


def proc_env_markers(pid: int) -> tuple[str | None, str | None]:
    """(TFCTL_RUN_ID, TFCTL_TASK) from pid's environment; (None, None) if unreadable or absent."""
    markers = proc_markers(pid)
    return markers.get(RUN_ENV), markers.get(TASK_ENV)


def proc_cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def live_pids() -> list[int]:
    """Every process that still runs (zombies are dead: they only wait to be reaped)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st["state"] not in ("Z", "X"):
                pids.append(int(name))
    return pids


def is_same_process(proc: dict) -> bool:
    """True if the pid recorded in `proc` is still that very process, not a reuse of its pid."""
    st = proc_stat(proc["pid"])
    return st is not None and st["state"] not in ("Z", "X") and st["starttime"] == proc["starttime"] and boot_id() == proc.get("boot_id", boot_id())


def task_processes(run_id: str, task: str, proc: dict | None) -> list[int]:
    """Every live process of one task: its process group, plus anything carrying its markers.

    A group member counts only while the group is provably the task's: its leader is the
    recorded process, or the leader is gone (the kernel does not reuse a pid that still names
    a process group, so a non-empty group whose leader died is still the original one).
    """
    own_group = None
    if proc is not None:
        leader = proc_stat(proc["pid"])
        if leader is None or leader["state"] in ("Z", "X") or is_same_process(proc):
            own_group = proc["pgid"]
    found = []
    me = os.getpid()
    for pid in live_pids():
        if pid == me:
            continue
        st = proc_stat(pid)
        if st is None:
            continue
        if own_group is not None and st["pgid"] == own_group:
            found.append(pid)
            continue
        run, marker = proc_env_markers(pid)
        if run == run_id and marker == task:
            found.append(pid)
    return found


def signal_all(pids: list[int], sig: int) -> None:
    groups = set()
    for pid in pids:
        st = proc_stat(pid)
        if st is not None and st["pgid"] == pid:
            groups.add(pid)
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate(find, grace: float) -> dict:
    """SIGTERM, wait up to `grace`, SIGKILL, wait, and report what still runs.

    `find` re-lists the target processes each round, so children forked during the grace
    period are caught as well.
    """
    seen: set[int] = set()
    pids = find()
    seen.update(pids)
    killed: set[int] = set()
    if pids:
        signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(POLL)
            pids = find()
            seen.update(pids)
        rounds = 0
        while pids and rounds < 100:
            killed.update(pids)
            signal_all(pids, signal.SIGKILL)
            time.sleep(POLL)
            pids = find()
            seen.update(pids)
            rounds += 1
    return {"processes": len(seen), "killed": len(killed), "remaining": pids}


# ---------------------------------------------------------------- ports


def listening_sockets() -> dict[int, set[int]]:
    """port -> socket inodes of TCP sockets in LISTEN state, IPv4 and IPv6."""
    ports: dict[int, set[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A":
                        port = int(parts[1].rsplit(":", 1)[1], 16)
                        ports.setdefault(port, set()).add(int(parts[9]))
        except OSError:
            continue
    return ports


def socket_owners(inodes: set[int], pids: list[int] | None = None) -> list[int]:
    """Processes (among `pids`, or all) holding one of the socket inodes."""
    wanted = {"socket:[%d]" % i for i in inodes}
    owners = []
    for pid in pids if pids is not None else live_pids():
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in wanted:
                    owners.append(pid)
                    break
            except OSError:
                continue
    return owners


# ---------------------------------------------------------------- task state


def task_state(root: str, run_id: str, task: str) -> dict:
    """The truth about one task, read from its files and from /proc."""
    d = task_dir(root, run_id, task)
    info: dict = {"task": task, "state": "pending", "pid": None, "pgid": None, "exit_code": None, "signal": None,
                  "started_at": None, "ended_at": None, "error": None}
    if not os.path.isdir(d):
        return info
    proc = read_json(os.path.join(d, "proc.json"))
    ended = read_json(os.path.join(d, "exit.json"))
    stop = read_json(os.path.join(d, "stop.json"))
    if proc:
        info.update(pid=proc["pid"], pgid=proc["pgid"], started_at=proc["started_at"])
    if ended:
        info.update(exit_code=ended.get("exit_code"), signal=ended.get("signal"), ended_at=ended["ended_at"],
                    error=ended.get("error"))
        if stop is not None and stop["requested_at"] <= ended["ended_at"]:
            info["state"] = "stopped"
        else:
            info["state"] = "succeeded" if ended.get("exit_code") == 0 else "failed"
    elif proc is None:
        info["state"] = "starting"
    elif is_same_process(proc):
        info["state"] = "running"
    else:
        monitor = proc.get("monitor")
        # The monitor writes exit.json right after the task ends; only its death loses the code.
        info["state"] = "running" if monitor and is_same_process(monitor) else "lost"
    return info


def last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read()
    except OSError:
        return ""
    for line in reversed(tail.splitlines()):
        if line.strip():
            return line.decode(errors="replace").strip()
    return ""


# ---------------------------------------------------------------- verbs


def verb_start(req: dict) -> dict:
    """Start each task under its own monitor; return once every task runs or has failed to."""
    root, run_id = req["root"], req["run_id"]
    started = {}
    for spec in req["tasks"]:
        d = task_dir(root, run_id, spec["task"])
        if os.path.exists(os.path.join(d, "spec.json")):
            raise AgentError("task %s of run %s was already started on this host" % (spec["task"], run_id))
        os.makedirs(d, mode=0o700, exist_ok=True)
        write_json(os.path.join(d, "spec.json"), spec)
        with open(os.path.join(d, "monitor.log"), "ab") as mlog:
            subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), "_monitor", d, run_id],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=mlog,
                start_new_session=True, close_fds=True, cwd="/",
            )
        started[spec["task"]] = d
    deadline = time.monotonic() + 15
    result = {}
    for task, d in started.items():
        while time.monotonic() < deadline:
            if os.path.exists(os.path.join(d, "proc.json")) or os.path.exists(os.path.join(d, "exit.json")):
                break
            time.sleep(POLL)
        result[task] = task_state(root, run_id, task)
        if result[task]["state"] == "pending":
            result[task]["state"] = "starting"
    return {"tasks": result}


def verb_monitor(d: str, run_id: str) -> None:
    """Run one task to its end, record how it ended, and clean up what it left behind."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    spec = read_json(os.path.join(d, "spec.json")) or {}
    env = dict(os.environ)
    env.update(spec.get("env", {}))
    env[RUN_ENV] = run_id
    env[TASK_ENV] = spec["task"]
    if spec.get("store"):
        env[STORE_ENV] = spec["store"]
    log = open(os.path.join(d, "output.log"), "ab", buffering=0)
    try:
        child = subprocess.Popen(
            ["/bin/sh", "-c", exec_form(spec["command"])], cwd=os.path.expanduser(spec.get("cwd") or "~"), env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    except OSError as e:
        write_json(os.path.join(d, "exit.json"), {"exit_code": 127, "signal": None, "ended_at": time.time(),
                                                  "error": "could not start: %s" % e})
        log.write(("tfctl: could not start task: %s\n" % e).encode())
        return
    me = proc_stat(os.getpid()) or {}
    child_stat = proc_stat(child.pid) or {}
    proc = {"pid": child.pid, "pgid": child.pid, "starttime": child_stat.get("starttime"), "boot_id": boot_id(),
            "started_at": time.time(), "monitor": {"pid": os.getpid(), "starttime": me.get("starttime"), "boot_id": boot_id()}}
    write_json(os.path.join(d, "proc.json"), proc)
    code = child.wait()
    ended = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None, "ended_at": time.time()}
    write_json(os.path.join(d, "exit.json"), ended)
    # The task is over; anything it started must not outlive it.
    terminate(lambda: task_processes(run_id, spec["task"], proc), float(spec.get("grace", 10)))


def verb_status(req: dict) -> dict:
    root, run_id = req["root"], req["run_id"]
    listening = listening_sockets()
    out = {}
    now = time.time()
    for task, port in req["tasks"].items():
        info = task_state(root, run_id, task)
        d = task_dir(root, run_id, task)
        proc = read_json(os.path.join(d, "proc.json"))
        info["listening"] = False
        if info["state"] == "running" and port in listening:
            info["listening"] = bool(socket_owners(listening[port], task_processes(run_id, task, proc)))
        info["last_line"] = last_line(os.path.join(d, "output.log"))
        if info["started_at"] is not None:
            info["uptime"] = (info["ended_at"] or now) - info["started_at"]
        out[task] = info
    return {"tasks": out, "time": now}


def verb_stop(req: dict) -> dict:
    """Stop tasks (all of the run's on this host when none are named) and prove they are gone."""
    root, run_id, grace = req["root"], req["run_id"], float(req.get("grace", 10))
    tasks = req.get("tasks")
    if tasks is None:
        base = run_dir(root, run_id)
        tasks = [n.replace("-", ":", 1) for n in sorted(os.listdir(base))] if os.path.isdir(base) else []
    procs = {}
    for task in tasks:
        d = task_dir(root, run_id, task)
        if not os.path.isdir(d):
            continue
        if not os.path.exists(os.path.join(d, "exit.json")) and not os.path.exists(os.path.join(d, "stop.json")):
            write_json(os.path.join(d, "stop.json"), {"requested_at": time.time()})
        procs[task] = read_json(os.path.join(d, "proc.json"))

    def find() -> list[int]:
        found: set[int] = set()
        for task, proc in procs.items():
            found.update(task_processes(run_id, task, proc))
        # Processes of this run whose task record is missing (a crashed start) are still ours.
        for pid in live_pids():
            if proc_env_markers(pid)[0] == run_id:
                found.add(pid)
        found.discard(os.getpid())
        return sorted(found)

    report = terminate(find, grace)
    report["ports"] = ports_after_stop(req.get("ports", []))
    # Give monitors a moment to record the exit, so status right after `down` reads "stopped".
    deadline = time.monotonic() + 3
    for task in procs:
        path = os.path.join(task_dir(root, run_id, task), "exit.json")
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(POLL)
    report["tasks"] = {t: task_state(root, run_id, t) for t in procs}
    return report


def ports_after_stop(ports: list, patience: float = 3.0) -> dict:
    """Port state once the processes are gone. A listening socket nobody owns any more is one
    the kernel is still tearing down: give it a moment before calling the port busy."""
    deadline = time.monotonic() + patience
    while True:
        state = verb_ports({"ports": ports})["ports"]
        orphaned = [p for p, info in state.items() if info["listening"] and not info["pids"]]
        if not orphaned or time.monotonic() > deadline:
            return state
        time.sleep(POLL)


def verb_sweep(req: dict) -> dict:
    """Stop every process started from this store (TFCTL_STORE) whose run is not live: orphans
    of a crashed controller. Runs started by other stores (other users, other homes) are never
    touched, even when this store has never heard of them."""
    live, store = set(req.get("live_runs", [])), req["store"]

    def orphan(markers: dict) -> bool:
        return markers.get(STORE_ENV) == store and markers.get(RUN_ENV) not in (None, *live)

    def find() -> list[int]:
        me = os.getpid()
        return [p for p in live_pids() if p != me and orphan(proc_markers(p))]

    runs = sorted({proc_env_markers(p)[0] for p in find()} - {None})
    report = terminate(find, float(req.get("grace", 10)))
    report["runs"] = runs
    return report


def verb_ports(req: dict) -> dict:
    """Which of the given ports something listens on, and who."""
    listening = listening_sockets()
    out = {}
    for port in req["ports"]:
        if port in listening:
            owners = socket_owners(listening[port])
            out[str(port)] = {"listening": True, "pids": owners,
                              "command": proc_cmdline(owners[0]) if owners else ""}
        else:
            out[str(port)] = {"listening": False, "pids": [], "command": ""}
    return {"ports": out}


def tail_offset(path: str, lines: int) -> int:
    """Byte offset where the last `lines` lines of the file begin."""
    try:
        f = open(path, "rb")
    except OSError:
        return 0
    with f:
        f.seek(0, 2)
        pos = f.tell()
        end = pos
        newlines = 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            if pos + step == end and block.endswith(b"\n"):
                block = block[:-1]
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 10:
                    newlines += 1
                    if newlines == lines:
                        return pos + i + 1
        return 0


def verb_tail(req: dict) -> dict:
    """The last `lines` lines of several tasks' output, in one answer (for diagnosis)."""
    root, run_id, count = req["root"], req["run_id"], int(req.get("lines", 200))
    tails = {}
    for task in req["tasks"]:
        path = os.path.join(task_dir(root, run_id, task), "output.log")
        try:
            with open(path, "rb") as f:
                f.seek(tail_offset(path, count))
                tails[task] = f.read(4 * 1024 * 1024).decode("utf-8", errors="replace").splitlines()
        except OSError:
            tails[task] = []
    return {"tails": tails}


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def verb_follow(req: dict) -> None:
    """Stream task output from byte offsets as JSON lines, complete lines only.

    Each chunk carries the byte offset it ends at, so a reader that loses the stream resumes
    exactly there: nothing is lost and nothing repeats. With `follow`, the stream goes on until
    every task has ended and its output is drained; each task's end is announced once.
    """
    root, run_id = req["root"], req["run_id"]
    offsets = {t: int(o) for t, o in req["tasks"].items()}
    if req.get("tail") is not None:
        offsets = {t: max(o, tail_offset(os.path.join(task_dir(root, run_id, t), "output.log"), int(req["tail"])))
                   for t, o in offsets.items()}
    follow = bool(req.get("follow"))
    files: dict = {}
    open_tasks = set(offsets)
    last_beat = time.monotonic()
    while open_tasks:
        progressed = False
        for task in sorted(open_tasks):
            # Read the state before the data: output written before the task ended is then
            # always read before its end is announced.
            state = task_state(root, run_id, task)["state"]
            final = state in ("succeeded", "failed", "stopped", "lost")
            f = files.get(task)
            if f is None:
                try:
                    f = files[task] = open(os.path.join(task_dir(root, run_id, task), "output.log"), "rb")
                except OSError:
                    f = None
            data = b""
            if f is not None:
                f.seek(offsets[task])
                data = f.read(CHUNK)
            if data:
                # Hand out whole lines; a partial last line waits for its end unless the task is
                # over, the read is a full chunk (more follows), or the line is absurdly long.
                cut = data.rfind(b"\n") + 1
                complete = final or not follow
                if cut and (len(data) == CHUNK or not complete):
                    data = data[:cut]
                elif not cut and not complete and len(data) < MAX_PARTIAL_LINE:
                    data = b""
            if data:
                offsets[task] += len(data)
                # "p": bytes after the last newline, so a reader that holds the partial line back
                # knows the exact offset where that line starts.
                emit({"t": task, "o": offsets[task], "p": len(data) - data.rfind(b"\n") - 1,
                      "d": data.decode("utf-8", errors="replace")})
                progressed = True
                continue
            if not follow or final:
                if follow:
                    emit({"t": task, "o": offsets[task], "end": state})
                open_tasks.discard(task)
        if not follow:
            continue
        if not progressed:
            if time.monotonic() - last_beat > HEARTBEAT:
                emit({"hb": time.time()})
                last_beat = time.monotonic()
            time.sleep(float(req.get("poll", 0.1)))
    for f in files.values():
        f.close()


def package_version(names: list) -> str | None:
    """An installed distribution's version from its metadata: no import, so no 3-second TF start.

    The supervisor runs without `site` (-S), so the interpreter's site-packages, as a task
    would see them, are computed here rather than taken from sys.path.
    """
    try:
        import site
        from importlib import metadata
    except ImportError:
        return None
    paths = list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]
    for name in names:
        for dist in metadata.distributions(name=name, path=paths):
            return "%s %s" % (name, dist.version)
    return None


def verb_info(req: dict) -> dict:
    """What preflight compares across hosts: who we are and which Python and TensorFlow run tasks."""
    python = req.get("python") or sys.executable
    out = {"hostname": socket.gethostname(), "agent_python": sys.version.split()[0], "python": None,
           "tensorflow": None}
    if os.path.realpath(shutil.which(python) or python) == os.path.realpath(sys.executable):
        out["python"] = sys.version.split()[0]
        out["tensorflow"] = package_version(TF_DISTRIBUTIONS)
    else:  # the tasks' interpreter, with its site-packages, is asked in a process of its own
        probe = ("import sys\ntry:\n from importlib import metadata as m\nexcept ImportError: m = None\n"
                 "v = None\nfor n in %r:\n" % (TF_DISTRIBUTIONS,) +
                 " try:\n  v = '%s %s' % (n, m.version(n)); break\n except Exception: pass\n"
                 "print(sys.version.split()[0]); print(v or '')")
        try:
            done = subprocess.run([python, "-c", probe], capture_output=True, timeout=30)
            lines = done.stdout.decode(errors="replace").splitlines()
            if done.returncode == 0 and lines:
                out["python"] = lines[0]
                out["tensorflow"] = lines[1] if len(lines) > 1 and lines[1] else None
            else:
                out["python_error"] = (done.stderr.decode(errors="replace").strip().splitlines() or ["failed"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            out["python_error"] = str(e)
    return out


def local_addresses() -> set:
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


def verb_probe(req: dict) -> dict:
    """TCP connect from this host to each target: what a task here would see reaching its peers."""
    timeout = float(req.get("timeout", 3))
    mine = local_addresses()
    results = {}
    for target in req["targets"]:
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        result = {"ok": False, "error": None, "address": None, "local": False}
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            result["error"] = "unresolvable"
            result["detail"] = str(e)
            results[target] = result
            continue
        family, kind, proto, _, sockaddr = infos[0]
        result["address"] = sockaddr[0]
        result["local"] = sockaddr[0] in mine or sockaddr[0].startswith("127.")
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
            result["ok"] = True
        except socket.timeout:
            result["error"] = "timeout"
        except ConnectionRefusedError:
            result["error"] = "refused"
        except OSError as e:
            result["error"] = "unreachable"
            result["detail"] = e.strerror or str(e)
        finally:
            sock.close()
        results[target] = result
    return {"results": results}


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


def verb_listen(req: dict) -> dict:
    """Hold the given ports open for a while (marked with `run_id`, stopped with `stop`), so the
    network between hosts can be checked before any TensorFlow task exists."""
    env = dict(os.environ, **{RUN_ENV: req["run_id"]})
    if req.get("store"):
        env[STORE_ENV] = req["store"]
    proc = subprocess.Popen([sys.executable, "-c", LISTENER, str(req.get("seconds", 60))]
                            + [str(p) for p in req["ports"]], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith(b"listening"):
        proc.wait()
        raise AgentError("cannot listen on ports %s: %s" % (
            req["ports"], (proc.stderr.read().decode(errors="replace").strip().splitlines() or ["?"])[-1]))
    return {"pid": proc.pid}


def read_manifest(cache: str) -> dict:
    return read_json(os.path.join(cache, ".tfctl-manifest.json")) or {}


def verb_sync_plan(req: dict) -> dict:
    """Which files of the controller's manifest this host's cache lacks or has in another version."""
    have = read_manifest(os.path.expanduser(req["cache"]))
    return {"need": sorted(p for p, entry in req["files"].items() if have.get(p, {}).get("sha") != entry["sha"])}


def verb_sync_apply(req: dict) -> dict:
    """Bring the cache up to the manifest (new files from the request), then copy it to `dest`.

    The cache keeps the last synced tree per cluster, so only changed files cross the network;
    each run still gets its own copy, so a later sync never changes a running task's files.
    """
    import base64

    cache, dest = os.path.expanduser(req["cache"]), os.path.expanduser(req["dest"])
    os.makedirs(cache, mode=0o700, exist_ok=True)
    files = req["files"]
    for rel, blob in req["blobs"].items():
        target = os.path.join(cache, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = "%s.tmp.%d" % (target, os.getpid())
        with open(tmp, "wb") as f:
            f.write(base64.b64decode(blob))
        os.chmod(tmp, files[rel]["mode"])
        os.replace(tmp, target)
    have = read_manifest(cache)
    for rel in set(have) - set(files):
        try:
            os.remove(os.path.join(cache, rel))
        except OSError:
            pass
    write_json(os.path.join(cache, ".tfctl-manifest.json"), files)
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    shutil.copytree(cache, dest, ignore=shutil.ignore_patterns(".tfctl-manifest.json"))
    return {"copied": len(req["blobs"]), "files": len(files), "dest": dest}


VERBS = {
    "start": verb_start,
    "status": verb_status,
    "stop": verb_stop,
    "sweep": verb_sweep,
    "ports": verb_ports,
    "info": verb_info,
    "probe": verb_probe,
    "listen": verb_listen,
    "tail": verb_tail,
    "sync_plan": verb_sync_plan,
    "sync_apply": verb_sync_apply,
}


def serve() -> None:
    """One request per line on stdin, one answer per line on stdout, until stdin closes.

    tfctl keeps one such process per host for a whole command, so each request costs a round
    trip instead of a new SSH channel and a new Python process.
    """
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            emit(VERBS[msg["verb"]](msg["req"]))
        except AgentError as e:
            emit({"error": str(e)})
        except Exception as e:  # noqa: BLE001 - a failed request must not end the conversation
            emit({"error": "%s failed: %s: %s" % (line[:40].strip(), type(e).__name__, e)})


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "_monitor":
        verb_monitor(argv[2], argv[3])
        return 0
    if len(argv) == 2 and argv[1] == "serve":
        try:
            serve()
        except BrokenPipeError:
            pass
        return 0
    if len(argv) != 2 or argv[1] not in (*VERBS, "follow"):
        sys.stderr.write("usage: agent.py {%s,follow,serve} < request.json\n" % ",".join(VERBS))
        return 2
    try:
        req = json.load(sys.stdin)
        if argv[1] == "follow":
            verb_follow(req)
            return 0
        emit(VERBS[argv[1]](req))
        return 0
    except AgentError as e:
        emit({"error": str(e)})
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
