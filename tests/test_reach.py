"""`tfctl ssh`, `tfctl exec`, `tfctl tensorboard` and the `logdir` key.

Task resolution, quoting and config errors in-process; then the real CLI on localhost: a
command in the task's directory and environment with its output live and its exit code passed
on, a shell on a pseudo-terminal, and TensorBoard behind a forwarded port, stopped with its run.
The same on simulated SSH hosts is in test_reach_ssh.py, which reuses the helpers here.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import urllib.request
from pathlib import Path

import pytest

from bench.waiting import WaitTimeout, wait_until
from tests.conftest import fake, free_ports, port_listening, spawn_tfctl, tfctl
from tests.fake_runs import end
from tfctl.cli.common import select_task
from tfctl.cluster.reach import task_command
from tfctl.config.loader import load_config, parse_config
from tfctl.controller.verbs import up
from tfctl.errors import ConfigError, UsageError
from tfctl.runs.record import RunRecord, TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor.procfs import live_pids, proc_cmdline
from tfctl.supervisor.protocol import RunState

CLUSTER = """name: reach
workdir: {workdir}
logdir: logs/{{run_id}}
env: {{WEIRD: "a b'c $(touch pwned) `id` \\"q\\""}}
command: "{{python}} task.py --logdir {{logdir}}"
jobs:
  ps: [localhost:{p0}]
  worker: [localhost:{p1}, localhost:{p2}]
"""


def stored_run(tmp_path: Path, text: str | None = None) -> tuple[Path, RunRecord]:
    """A cluster file and a finished run of it, recorded but never started (as after `down`)."""
    workdir = tmp_path / "work dir"  # a space, to prove cwd is quoted
    workdir.mkdir(exist_ok=True)
    path = tmp_path / "cluster.yaml"
    p0, p1, p2 = free_ports(3)
    path.write_text(text or CLUSTER.format(workdir=workdir, p0=p0, p1=p1, p2=p2))
    store = RunStore()
    record = up.plan_run(load_config(path), store).record
    store.create(record)
    return path, end(store, record.run_id, RunState.SUCCEEDED, "test")


# -- task names ---------------------------------------------------------------------------------


def cwd_of(task: TaskSpec) -> Path:
    assert task.cwd is not None  # every task of stored_run has one
    return Path(task.cwd)


def test_a_task_is_named_by_job_and_index_or_by_a_job_with_one_task(tmp_path, home):
    _, record = stored_run(tmp_path)
    assert select_task(record, "worker:1").name == "worker:1"
    assert select_task(record, "ps").name == "ps:0"
    with pytest.raises(UsageError) as ambiguous:
        select_task(record, "worker")
    assert ambiguous.value.message == f"job 'worker' has 2 tasks in run {record.run_id}: name one"
    assert ambiguous.value.hint == "choose from: worker:0, worker:1"
    with pytest.raises(UsageError) as unknown:
        select_task(record, "worker:2")
    assert unknown.value.message == f"no task 'worker:2' in run {record.run_id}"
    assert unknown.value.hint == "choose from: ps, ps:0, worker:0, worker:1"  # not `worker`: it has two


def test_the_command_line_quotes_every_value_and_each_word_of_the_command(tmp_path, home):
    _, record = stored_run(tmp_path)
    task = record.task("worker:0")
    argv = ["printf", "%s|", "$HOME", "a  b", "; touch pwned2", "'"]
    line = task_command(task, argv)
    out = subprocess.run(["/bin/sh", "-c", line + ' && printf "%s|%s" "$WEIRD" "$PWD"'], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"$HOME|a  b|; touch pwned2|'|{task.env['WEIRD']}|{task.cwd}"
    assert list(cwd_of(task).iterdir()) == []  # no `pwned`: nothing ran that should not have
    assert task_command(task, None).endswith('exec "${SHELL:-/bin/sh}"')
    assert "TFCTL_RUN_ID" not in line  # the user's processes are not the run's: `down` leaves them alone


# -- the logdir key --------------------------------------------------------------------------------

BASE = "name: x\njobs: {worker: [localhost:2222]}\n"


def problems(text: str, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, tmp_path / "cluster.yaml")
    return caught.value.message


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            BASE + "command: run --out {logdir}\n",
            [
                "cluster.yaml:3:10: command: uses `{logdir}`, but the file has no `logdir`",
                "fix: add a top-level `logdir: logs/{run_id}` (relative paths start at each task's workdir)",
            ],
        ),
        (
            "name: x\njobs:\n  worker: {hosts: [localhost:2222], command: 'run {logdir}'}\n",
            ["jobs.worker.command: uses `{logdir}`, but the file has no `logdir`"],
        ),
        (
            BASE + "command: run\nlogdir: logs/{job_name}\n",
            [
                "cluster.yaml:4:9: logdir: unknown placeholder `{job_name}`",
                "fix: `logdir` is one directory for every task: its only placeholder is {run_id}",
            ],
        ),
        (BASE + "command: run\nlogdir: logs/{run}\n", ["did you mean `{run_id}`?"]),
        (BASE + "command: run\nlogdir: 7\n", ["logdir: expected a string, found a number (7)", "fix: quote it"]),
        (
            BASE + "command: run\nlogdir: logs/{run_id\n",
            ["logdir: malformed braces", "placeholders look like `{run_id}`"],
        ),
    ],
)
def test_logdir_mistakes_name_file_line_key_and_fix(text, expected, tmp_path):
    message = problems(text, tmp_path)
    for part in expected:
        assert part in message, message


def test_logdir_fills_its_placeholder_and_the_record(tmp_path, home):
    text = BASE + "command: run --logdir={logdir} --dir {logdir}/x\nlogdir: '~/tb/{run_id} {{x}}'\n"
    (tmp_path / "cluster.yaml").write_text(text)
    record = up.plan_run(load_config(tmp_path / "cluster.yaml"), RunStore()).record
    assert record.logdir == f"~/tb/{record.run_id} {{x}}"
    # `~/` is left for the host's shell to expand, as for {python}; the rest is one quoted word.
    assert record.tasks[0].command == f"run --logdir=~/'tb/{record.run_id} {{x}}' --dir ~/'tb/{record.run_id} {{x}}'/x"


# -- the real CLI on localhost -----------------------------------------------------------------


def test_exec_runs_in_the_tasks_directory_with_its_environment_and_passes_the_exit_code(tmp_path, home):
    path, record = stored_run(tmp_path)
    task = record.task("worker:1")
    script = 'pwd; echo "$TF_CONFIG"; echo "$WEIRD"; echo oops >&2; exit 3'
    done = tfctl("-f", str(path), "exec", "worker:1", "--", "sh", "-c", script, home=home)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == [task.cwd, task.env["TF_CONFIG"], task.env["WEIRD"]]
    assert '"task":{"type":"worker","index":1}' in done.stdout
    assert done.stderr == "oops\n"
    builtin = tfctl("-f", str(path), "exec", "ps", "exit", "4", home=home)  # a builtin, without `--`
    assert builtin.returncode == 4
    assert not (cwd_of(task) / "pwned").exists()


def fed(args: list[str], home: Path, text: str) -> subprocess.CompletedProcess:
    """The real CLI with `text` on its stdin (a pipe, not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "tfctl", *args],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )


def test_piped_input_reaches_exec_and_feeds_ssh_its_commands(tmp_path, home):
    path, record = stored_run(tmp_path)
    copied = fed(["-f", str(path), "exec", "ps", "--", "cat"], home, "line 1\nline 2\n")
    assert (copied.returncode, copied.stdout) == (0, "line 1\nline 2\n")
    # Without a terminal there is none to give the shell: it reads its commands from the pipe.
    script = fed(["-f", str(path), "ssh", "worker:1"], home, 'echo "cwd=$(pwd)"\nexit 6\n')
    assert (script.returncode, script.stdout) == (6, f"cwd={record.task('worker:1').cwd}\n")
    assert fed(["-f", str(path), "ssh", "worker:1"], home, "true\n").returncode == 0  # ends with its input


def test_exec_streams_output_while_the_command_runs(tmp_path, home):
    path, record = stored_run(tmp_path)
    script = "echo first; echo first-err >&2; while [ ! -e go ]; do sleep 0.05; done; echo second"
    proc = spawn_tfctl("-f", str(path), "exec", "worker:0", "--", "sh", "-c", script, home=home)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert readline(proc.stdout, 30) == "first\n"  # while the command still waits for `go`
        assert readline(proc.stderr, 30) == "first-err\n"
        (cwd_of(record.task("worker:0")) / "go").touch()
        assert proc.stdout.read() == "second\n"
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_usage_mistakes_are_sentences_with_exit_code_2(tmp_path, home):
    path, record = stored_run(tmp_path)
    ambiguous = tfctl("-f", str(path), "exec", "worker", "--", "true", home=home)
    assert ambiguous.returncode == 2
    assert ambiguous.stderr == (
        f"error: job 'worker' has 2 tasks in run {record.run_id}: name one\nhint: choose from: worker:0, worker:1\n"
    )
    empty = tfctl("-f", str(path), "exec", "ps", "--", home=home)
    assert (empty.returncode, empty.stderr.splitlines()[0]) == (2, "error: no command to run")
    shell = tfctl("-f", str(path), "ssh", "nope", home=home)
    assert shell.returncode == 2 and f"error: no task 'nope' in run {record.run_id}" in shell.stderr


def test_ssh_on_localhost_opens_a_shell_in_the_tasks_directory(tmp_path, home):
    path, record = stored_run(tmp_path)
    task = record.task("worker:1")
    with Terminal(["-f", str(path), "ssh", "worker:1"], home, env={"SHELL": "/bin/sh"}) as term:
        term.prompt()
        term.send('echo "cwd=$(pwd)"; echo "tf=$TF_CONFIG"; exit 5\n')
        assert term.finish() == 5
    assert f"cwd={task.cwd}\n" in term.text()  # typed-ahead input is echoed as typed: only output is expanded
    assert f"tf={task.env['TF_CONFIG']}\n" in term.text()


# -- tensorboard -------------------------------------------------------------------------------


def test_tensorboard_without_logdir_names_the_file_the_key_and_the_fix(tmp_path, home):
    path, record = stored_run(tmp_path, BASE + "command: run\n")
    done = tfctl("-f", str(path), "tensorboard", home=home)
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"error: run {record.run_id} has no logdir: its cluster file {path} had no `logdir` key\n"
        "hint: add e.g. `logdir: logs/{run_id}`"
    ), done.stderr


def test_tensorboard_of_a_run_that_wrote_no_summaries_says_where_it_looked_and_why(tmp_path, home):
    path, record = stored_run(tmp_path)  # ended: no event file will ever come
    logdir = cwd_of(record.task("worker:0")) / "logs" / record.run_id
    said = (
        f"error: run {record.run_id} has nothing for TensorBoard: the logdir localhost:{logdir} (the run's "
        "`logdir`, from worker:0's workdir) {}: its program wrote no summaries there\n"
        "hint: write them with tf.summary (a tf.summary.create_file_writer, or TF1's FileWriter) to the path "
        "`{{logdir}}` gives the command, as the templates of `tfctl init` do with --logdir={{logdir}}\n"
    )
    done = tfctl("-f", str(path), "tensorboard", home=home, timeout=60)  # not served: nothing to wait for
    assert (done.returncode, done.stdout, done.stderr) == (2, "", said.format("does not exist")), done.stderr
    (logdir / "worker_0").mkdir(parents=True)
    (logdir / "worker_0" / "notes.txt").write_text("no summaries\n")
    done = tfctl("-f", str(path), "tensorboard", home=home, timeout=60)
    assert done.stderr == said.format("holds no TensorBoard event file (events.out.tfevents.*)"), done.stderr


def test_tensorboard_on_a_python_without_it_names_the_host_the_python_and_the_fix(tmp_path, home):
    python = tmp_path / "bare-python"  # this interpreter without site-packages: no tensorboard
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    path, _ = stored_run(tmp_path, BASE + f"command: run\nlogdir: logs\npython: {python}\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.out.tfevents.1.localhost").write_bytes(b"")  # summaries to serve
    done = tfctl("-f", str(path), "tensorboard", home=home)
    assert done.returncode == 1
    assert done.stderr == (
        f"error: localhost: {python} has no tensorboard\n"
        f"hint: install it there: {python} -m pip install tensorboard (or point `python` in the cluster file at "
        "one that has it)\n"
    )


def find_tensorboard_python() -> str | None:
    """This interpreter, when it has tensorboard (the `tf` extra installs it)."""
    found = subprocess.run([sys.executable, "-c", "import tensorboard"], capture_output=True).returncode == 0
    return sys.executable if found else None


NO_TENSORBOARD = f"no tensorboard in {sys.executable}: pip install -e '.[tf]'"


def tensorboard_python() -> str:
    python = find_tensorboard_python()
    if python is None:
        pytest.skip(NO_TENSORBOARD)
    return python


def test_tensorboard_is_served_through_a_forwarded_port_and_stops_with_its_run(tmp_path, home):
    python = tensorboard_python()
    (port,) = free_ports(1)
    work = tmp_path / "work"
    work.mkdir()
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"name: board\nworkdir: {work}\npython: {python}\nlogdir: logs/{{run_id}}\n"
        f'command: "{fake(f"--name w --port {port} --sleep -1")}"\njobs: {{worker: [localhost:{port}]}}\n'
    )
    assert tfctl("-f", str(path), "up", "-d", home=home).returncode == 0
    with socket_on_free_port() as busy:  # the local port asked for is taken: another is used
        board = start_tensorboard(["-f", str(path), "tensorboard", "--port", str(busy)], home)
        try:
            url = board.url(timeout=120)
            assert url != f"http://127.0.0.1:{busy}/"
            assert fetch(url) == 200
            stop = tfctl("-f", str(path), "down", home=home)
            assert stop.returncode == 0, stop.stderr
            rest = board.finish(timeout=30)
        finally:
            board.kill()
    assert board.proc.returncode == 0, rest
    assert (
        rest.startswith(  # the task writes no summaries: served all the same, since the run was live
            f"warning: the logdir localhost:{work}/logs/board-"
        )
        and "does not exist: its program wrote no summaries there yet; TensorBoard shows them once it does" in rest
    )
    assert f"port {busy} is in use here; forwarding port {url.split(':')[2][:-1]} instead" in rest
    ended = r"run board-\S+ ended: TensorBoard stopped on localhost \(\d processes; 0 remain; its port is closed\)"
    assert re.search(ended, rest), rest
    assert not port_listening(int(url.split(":")[2][:-1]))
    assert [p for p in live_pids() if "tensorboard" in proc_cmdline(p) and str(work) in proc_cwd(p)] == []


# -- helpers (also used by test_reach_ssh.py) ------------------------------------------------------


def readline(stream, timeout: float) -> str:
    """One line from a pipe, failing the test rather than hanging past `timeout`."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert got, f"no line within {timeout}s"
    return got[0]


def fetch(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert b"TensorBoard" in answer.read()
        return answer.status


def proc_cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


class socket_on_free_port:
    """A port something listens on for the duration of a `with`."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return self.sock.getsockname()[1]

    def __exit__(self, *_exc: object) -> None:
        self.sock.close()


class start_tensorboard:
    """`tfctl tensorboard` as a user runs it: its URL on stdout, its story on stderr."""

    def __init__(self, args: list[str], home: Path, env: dict[str, str] | None = None) -> None:
        self.proc = spawn_tfctl(*args, home=home, env=env)

    def url(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        line = readline(self.proc.stdout, timeout)
        assert line.startswith("http://127.0.0.1:"), line + self.finish(5)
        return line.strip()

    def finish(self, timeout: float) -> str:
        """Its stderr once it has exited (killed after `timeout`)."""
        assert self.proc.stderr is not None
        killer = threading.Timer(timeout, self.proc.kill)
        killer.start()
        try:
            text = self.proc.stderr.read()
            self.proc.wait()
        finally:
            killer.cancel()
        return text

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Terminal:
    """The real CLI on a pseudo-terminal of its own (its controlling terminal, as in a terminal
    emulator), driven like a user at a keyboard."""

    def __init__(self, args: list[str], home: Path, rows: int = 30, cols: int = 100, env: dict | None = None) -> None:
        self.master, self.slave = os.openpty()
        self.resize(rows, cols)
        self.modes = termios.tcgetattr(self.slave)
        self.output = b""
        self.seen = 0  # how far `expect` has read
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfctl", *args],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
            env={**os.environ, "TFCTL_HOME": str(home), **(env or {})},
        )

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        os.close(self.slave)

    def resize(self, rows: int, cols: int) -> None:
        """As a terminal window does: the kernel tells the foreground processes (SIGWINCH)."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def _read(self, timeout: float) -> bool:
        if select.select([self.master], [], [], timeout)[0]:
            self.output += os.read(self.master, 65536)
            return True
        return False

    def expect(self, pattern: str, timeout: float = 30) -> None:
        """Wait for output matching `pattern` after what earlier calls matched, and move past it
        (output may arrive in any chunks: a reply and the next prompt together, or apart)."""
        regex = re.compile(pattern.encode())

        def match() -> re.Match[bytes] | None:
            found = regex.search(self.output, self.seen)
            if found is None:
                self._read(0.2)  # up to 0.2 s for more output
            return found

        try:
            found = wait_until(match, timeout, f"output matching {pattern!r}", interval=0)
        except WaitTimeout:
            raise AssertionError(f"no {pattern!r} within {timeout}s in {self.output[self.seen :]!r}") from None
        assert found is not None
        self.seen = found.end()

    def prompt(self) -> None:
        """Wait for the shell's prompt: a shell may drop what was typed before it was ready."""
        self.expect(r"[#$] $")

    def finish(self, timeout: float = 30) -> int:
        """The exit code, once the CLI has ended and everything it wrote was read."""

        def ended() -> bool:
            if self.proc.poll() is not None:
                return True
            self._read(0.2)  # up to 0.2 s for more output
            return False

        try:
            wait_until(ended, timeout, "the CLI ending", interval=0)
        except WaitTimeout:
            raise AssertionError(f"still running after {timeout}s: {self.output!r}") from None
        while self._read(0.2):
            pass
        assert termios.tcgetattr(self.slave) == self.modes, "the terminal's modes were not restored"
        return self.proc.returncode

    def text(self) -> str:
        return self.output.decode(errors="replace").replace("\r\n", "\n")
