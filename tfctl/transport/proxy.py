"""ProxyCommand for the SSH transport: the command OpenSSH would run, and the process running it.

OpenSSH runs a ProxyCommand as `$SHELL -c "exec COMMAND"` (/bin/sh without $SHELL) and speaks SSH
over its stdin and stdout; so does tfctl, whose end is one end of a socket pair, so paramiko gets
a real socket (timeouts and end-of-file work as with TCP), and the process never outlives the
connection.
"""

from __future__ import annotations

import collections
import os
import re
import shlex
import socket
import subprocess
import threading

PROXY_STDERR_LINES = 20  # what a failing ProxyCommand said last, for the error message


def proxy_command(template: str, hostname: str, port: int, user: str, alias: str) -> str:
    """OpenSSH's ProxyCommand tokens: %h %p %r %n %%. The values are shell-quoted (a plain name
    stays as it is), so a host name can never add shell syntax to the command."""

    def value(match: re.Match[str]) -> str:
        token = match.group(1)
        if token == "%":
            return "%"
        values = {"h": hostname, "p": str(port), "r": user, "n": alias}
        if token not in values:
            raise ValueError(f"%{token}")
        return shlex.quote(values[token])

    return re.sub(r"%(.)", value, template)


class Proxy:
    """A running ProxyCommand: our end of its socket pair is the SSH connection's socket."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.sock, theirs = socket.socketpair()
        self.said: collections.deque[str] = collections.deque(maxlen=PROXY_STDERR_LINES)
        try:
            # Its own session: a Ctrl-C at the terminal must not cut the connection tfctl then
            # uses to stop the run. It ends when we close our end (EOF), or by `end`.
            self.proc = subprocess.Popen(
                [os.environ.get("SHELL") or "/bin/sh", "-c", f"exec {command}"],
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            self.sock.close()
            raise
        finally:
            theirs.close()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:  # until the command exits
            for line in self.proc.stderr:
                if text := line.decode(errors="replace").strip():
                    self.said.append(text)

    def failure(self) -> str:
        """Why the connection through it failed, as far as the command tells."""
        try:
            code: int | None = self.proc.wait(1.0)
            self._reader.join(1.0)
        except subprocess.TimeoutExpired:
            code = None
        said = f": {self.said[-1]}" if self.said else ""
        return f"ProxyCommand `{self.command}` " + (
            f"exited with code {code}{said}" if code is not None else f"relays no SSH server{said}"
        )

    def end(self) -> None:
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
