"""Commands on a remote host over SSH, with paramiko, behaving like `ssh` with ~/.ssh/config.

One authenticated connection per host carries every command as its own exec channel, so a
cluster of N hosts costs N handshakes, not one per call. Host keys are tfctl's decision, not
paramiko's: strict by default, `accept-new` on request (pinned in tfctl's own known_hosts), and a
changed key is always fatal, on every hop of a ProxyJump chain. A ProxyCommand runs as OpenSSH
runs it (`/bin/sh -c "exec COMMAND"`, its %-tokens filled in), talking SSH over a socket pair.
This is the only module that imports paramiko; `tfctl.transport.connect` imports it lazily.
"""

from __future__ import annotations

import getpass
import logging
import os
import posixpath
import re
import secrets
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paramiko

from tfctl import trace
from tfctl.config.home import tfctl_home
from tfctl.errors import HostError
from tfctl.transport import terminal
from tfctl.transport.base import Result, Stream, Transport, Tunnel, shell_path
from tfctl.transport.channels import CHUNK, ChannelTunnel, SSHStream, write_stderr
from tfctl.transport.proxy import Proxy, proxy_command

DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")  # paramiko's look_for_keys
MAX_JUMP_DEPTH = 8  # ProxyJump hops whose own config has a ProxyJump: stop loops like `Host *`

# Every failure reaches the user as a HostError; paramiko's own log lines would only repeat it.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class _Endpoint:
    """One SSH server on the way to the host, as the ssh config describes it."""

    alias: str  # the name as written: cluster file, `destination`, or a ProxyJump hop
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    use_agent: bool
    known_hosts: tuple[Path, ...]
    proxy_command: str | None = None  # tokens filled in; the connection goes through it

    @property
    def known_name(self) -> str:
        """The name known_hosts files record it under, as OpenSSH writes it."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def __str__(self) -> str:
        addr = self.hostname if self.port == 22 else f"{self.hostname}:{self.port}"
        return addr if addr == self.alias else f"{self.alias} ({addr})"


class _SSHConfig(paramiko.SSHConfig):
    """paramiko's parser, but ProxyCommand's %-tokens are left for `proxy_command`: paramiko
    fills them from the ssh config alone, so %p and %r would miss a port or user the cluster file
    sets."""

    TOKENS_BY_CONFIG_KEY = {**paramiko.SSHConfig.TOKENS_BY_CONFIG_KEY, "proxycommand": []}


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"  # e.g. "ssh-ed25519 SHA256:..." like OpenSSH


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """An unknown key: refuse it, or (accept-new) pin it in tfctl's known_hosts and go on."""

    def __init__(self, host: str, endpoint: _Endpoint, accept_new: bool, pin_file: Path) -> None:
        self.host, self.endpoint, self.accept_new, self.pin_file = host, endpoint, accept_new, pin_file

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        ep = self.endpoint
        if not self.accept_new:
            scan = f"ssh-keyscan{'' if ep.port == 22 else f' -p {ep.port}'} {ep.hostname}"
            raise HostError(
                self.host,
                f"unknown host key for {hostname} ({_fingerprint(key)})",
                hint=f"if that fingerprint is the host's, run again with --accept-new-host-keys "
                f"to pin it in {self.pin_file}, or add it yourself: "
                f"{scan} >> ~/.ssh/known_hosts",
            )
        self.pin_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.pin_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:  # one short O_APPEND write: concurrent pins do not interleave
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHTransport(Transport):
    """A host reached over SSH; `host` is the cluster's name, `destination` the SSH target.

    `stderr_sink` receives the remote stderr of streams (default: this process's stderr).
    """

    def __init__(
        self,
        host: str,
        *,
        destination: str | None = None,
        user: str | None = None,
        port: int | None = None,
        identity_file: str | os.PathLike | None = None,
        ssh_config_path: str | os.PathLike | None = None,
        known_hosts: list[str | os.PathLike] | None = None,
        accept_new_host_keys: bool = False,
        connect_timeout: float = 10,
        keepalive: float = 15,
        stderr_sink: Callable[[str], None] = write_stderr,
    ) -> None:
        self.host = host
        self._destination = destination or host
        self._user = user
        self._port = port
        self._identity = os.path.expanduser(identity_file) if identity_file else None
        self._ssh_config_path = Path(ssh_config_path or DEFAULT_SSH_CONFIG).expanduser()
        self._known_hosts = None if known_hosts is None else tuple(Path(p).expanduser() for p in known_hosts)
        self._pin_file = tfctl_home() / "known_hosts"  # always read; accept-new appends here
        self._accept_new = accept_new_host_keys
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive
        self._stderr_sink = stderr_sink
        self._lock = threading.Lock()
        self._clients: list[paramiko.SSHClient] = []  # jump hops first, the host itself last
        self._proxies: list[Proxy] = []  # the ProxyCommand the first of them goes through

    @property
    def is_local(self) -> bool:
        return False

    # -- commands

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        with trace.span("transport.run", self.host, command=command):
            return self._run(command, stdin, timeout)

    def _run(self, command: str, stdin: bytes | None, timeout: float | None) -> Result:
        deadline = None if timeout is None else time.monotonic() + timeout
        chan = self._exec(command, closes_stdin=True)
        out: list[bytes] = []
        err: list[bytes] = []
        # Both outputs are drained while stdin is written: a command that fills one of them
        # (or echoes its stdin) would otherwise stall on a full SSH window.
        readers = [_spawn(_read_all, chan.recv, out), _spawn(_read_all, chan.recv_stderr, err)]
        _spawn(_feed, chan, stdin)
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if any(r.is_alive() for r in readers) or not chan.status_event.wait(
            None if deadline is None else max(0.0, deadline - time.monotonic())
        ):
            chan.close()
            raise HostError(self.host, f"command timed out after {timeout:g}s: {command}")
        if chan.exit_status < 0 and not chan.get_transport().is_active():
            raise HostError(self.host, f"connection lost while running: {command}")
        # -1 with the link up: the session's shell died of a signal (paramiko does not say
        # which one); a command that did shows as 128 + the signal's number.
        return Result(
            self.host,
            command,
            chan.exit_status,
            b"".join(out).decode(errors="replace"),
            b"".join(err).decode(errors="replace"),
        )

    def stream(self, command: str, *, stdin: bytes | None = None) -> Stream:
        with trace.span("transport.stream", self.host, command=command):  # until the channel is open
            chan = self._exec(command, closes_stdin=stdin is not None)
        if stdin is not None:
            _spawn(_feed, chan, stdin)
        return SSHStream(chan, self._stderr_sink)

    def attach(self, command: str, *, tty: bool) -> int:
        """With `tty`, a pseudo-terminal on the host (paramiko's get_pty) relayed to ours in raw
        mode, as `ssh -t` does. Through paramiko rather than by running the system `ssh`, so the
        session is checked against the same host keys, ProxyJump chain and identities as every
        other command of tfctl (strict known_hosts plus tfctl's own pins), whatever the system
        client's configuration would do. A remote death by signal is reported as 255, as ssh does."""
        pty = terminal.window_size() if tty else None
        with trace.span("transport.attach", self.host, command=command):
            # Not `closes_stdin`: the session ends with the command, even while our stdin stays
            # open; a late EOF can only drop this connection, which carries nothing else.
            chan = self._exec(command, closes_stdin=False, pty=pty)
        try:
            (terminal.relay_terminal if tty else terminal.relay_output)(chan)
            status = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(self.host, f"the connection was lost before the command ended ({e})") from e
        finally:
            chan.close()
        if status < 0:
            if not chan.get_transport().is_active():
                raise HostError(self.host, "the connection was lost before the command ended")
            return 255
        return status

    def tunnel(self, port: int) -> Tunnel:
        try:
            chan = self._transport().open_channel(
                "direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=self._connect_timeout
            )
        except paramiko.ChannelException as e:
            raise HostError(self.host, f"cannot connect to its port {port}: {e.text}") from e
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(self.host, f"cannot open a tunnel to its port {port}: {e}") from e
        return ChannelTunnel(chan)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        parent, name = posixpath.split(path)
        tmp = posixpath.join(parent, f".{name}.tfctl-{secrets.token_hex(4)}")
        dst, tmp_q, dir_q = shell_path(path), shell_path(tmp), shell_path(parent or ".")
        # umask 077: new parent dirs are 0700 and the temp file is never readable by others;
        # rename(2) within one directory makes the write atomic.
        command = (
            f"umask 077 && mkdir -p -- {dir_q} && cat > {tmp_q} && chmod {mode:o} {tmp_q} && "
            f"mv -f -- {tmp_q} {dst} || {{ rm -f -- {tmp_q}; exit 1; }}"
        )
        with trace.span("transport.put", self.host, path=path, bytes=len(data)):
            result = self.run(command, stdin=data, timeout=max(60.0, len(data) / 1e6))  # >= 1 MB/s
        if not result.ok:
            raise HostError(self.host, f"cannot write {path}: {result.stderr.strip() or result.exit_code}")

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    # -- connection

    def _exec(self, command: str, closes_stdin: bool, pty: tuple[int, int] | None = None) -> paramiko.Channel:
        """A channel running `command`. `closes_stdin`: we will send its stdin's EOF, so the
        session waits for it (a stream we keep writing to ends with its command instead).
        `pty`: (columns, rows) of a pseudo-terminal to run it on."""
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self._connect_timeout)
            if pty is not None:
                chan.get_pty(os.environ.get("TERM") or "vt100", *pty)
            chan.exec_command(_reading_stdin_to_the_end(command) if closes_stdin else command)
        except paramiko.ChannelException as e:
            raise HostError(
                self.host,
                f"the SSH server refused a new session: {e.text}",
                hint="too many concurrent commands? raise MaxSessions in the host's sshd_config",
            ) from e
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(self.host, f"cannot start a command over SSH: {e}") from e
        return chan

    def _transport(self) -> paramiko.Transport:
        """The live connection, made on first use and again after close() or a dropped link."""
        with self._lock:
            if self._clients:
                transport = self._clients[-1].get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._disconnect()
            with trace.span("transport.connect", self.host, destination=self._destination):
                config = self._ssh_config()
                chain = self._chain(config, self._destination, self._user, self._port, self._identity)
                for i, endpoint in enumerate(chain):
                    try:
                        self._clients.append(self._open(endpoint, chain[i - 1] if i else None, i < len(chain) - 1))
                    except BaseException:
                        self._disconnect()
                        raise
            return _connection(self._clients[-1])

    def _disconnect(self) -> None:
        for client in reversed(self._clients):
            client.close()
        self._clients = []
        for proxy in self._proxies:
            proxy.end()
        self._proxies = []

    def _ssh_config(self) -> paramiko.SSHConfig:
        if not self._ssh_config_path.exists():
            return _SSHConfig()
        try:
            return _SSHConfig.from_path(str(self._ssh_config_path))
        except (OSError, paramiko.SSHException, ValueError) as e:
            raise HostError(self.host, f"cannot read {self._ssh_config_path}: {e}") from e

    def _chain(
        self,
        config: paramiko.SSHConfig,
        alias: str,
        user: str | None,
        port: int | None,
        identity: str | None,
        depth: int = 0,
        follow_jump: bool = True,
    ) -> list[_Endpoint]:
        """The servers to connect through, in order, ending with `alias` itself.

        Like OpenSSH, the first hop of a ProxyJump follows its own ProxyJump (or ProxyCommand);
        later hops do not. A ProxyJump wins over a ProxyCommand.
        """
        cfg = config.lookup(alias)
        try:
            port = int(port or cfg.get("port") or 22)
        except ValueError:
            raise HostError(self.host, f"bad Port {cfg.get('port')!r} for {alias} in {self._ssh_config_path}") from None
        key_files = (identity,) if identity else tuple(os.path.expanduser(k) for k in cfg.get("identityfile", []))
        known_hosts = (
            self._known_hosts
            if self._known_hosts is not None
            else tuple(Path(p).expanduser() for p in shlex.split(cfg.get("userknownhostsfile", DEFAULT_KNOWN_HOSTS)))
        )
        user = user or cfg.get("user") or getpass.getuser()
        jump = cfg.get("proxyjump", "none")
        proxy = cfg.get("proxycommand") if follow_jump and jump.lower() == "none" else None
        if proxy is not None:
            try:
                proxy = proxy_command(proxy, cfg["hostname"], port, user, alias)
            except ValueError as e:
                raise HostError(
                    self.host,
                    f"ProxyCommand for {alias} in {self._ssh_config_path} uses {e}, which tfctl does not fill in",
                    hint="use %h (host name), %p (port), %r (user), %n (the name as written) or %% (a %)",
                ) from None
        endpoint = _Endpoint(
            alias,
            cfg["hostname"],
            port,
            user,
            key_files,
            cfg.get("identitiesonly", "no").lower() != "yes",
            known_hosts,
            proxy,
        )
        if not follow_jump or jump.lower() == "none":
            return [endpoint]
        if depth >= MAX_JUMP_DEPTH:
            raise HostError(
                self.host,
                f"ProxyJump chain longer than {MAX_JUMP_DEPTH} hops at {alias}",
                hint=f"a loop in {self._ssh_config_path}? exclude jump hosts from `Host *` patterns",
            )
        hops = [self._hop(h) for h in jump.split(",")]
        chain = self._chain(config, *hops[0], None, depth + 1)
        for hop in hops[1:]:
            chain += self._chain(config, *hop, None, depth + 1, follow_jump=False)
        return chain + [endpoint]

    def _hop(self, hop: str) -> tuple[str, str | None, int | None]:
        """`[user@]host[:port]` (or `[v6addr]:port`, or an ssh:// URI) -> (host, user, port)."""
        user, _, hostport = hop.strip().removeprefix("ssh://").rpartition("@")
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", hostport)
        if not m:
            raise HostError(
                self.host,
                f"cannot parse ProxyJump hop {hop!r} in {self._ssh_config_path}",
                hint="write each hop as [user@]host[:port], separated by commas",
            )
        port = m.group(2) or m.group(4)
        return m.group(1) or m.group(3), user or None, int(port) if port else None

    def _open(self, ep: _Endpoint, via: _Endpoint | None, is_hop: bool) -> paramiko.SSHClient:
        """Connect and authenticate to `ep`, directly or through the last client (a jump host)."""
        sock = self._socket(ep) if via is None else self._tunnel(ep, via)
        where = f"jump host {ep}: " if is_hop else ""
        client = paramiko.SSHClient()
        keys = client.get_host_keys()
        for path in dict.fromkeys(ep.known_hosts + (self._pin_file,)):
            try:
                if path.exists():
                    keys.load(str(path))
            except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError) as e:
                sock.close()
                raise HostError(
                    self.host, f"cannot read known hosts file {path}: {e}", hint="fix or delete the broken line"
                ) from e
        client.set_missing_host_key_policy(_HostKeyPolicy(self.host, ep, self._accept_new, self._pin_file))
        key_files = [k for k in ep.key_files if os.path.exists(k)]
        try:
            client.connect(
                ep.hostname,
                ep.port,
                username=ep.user,
                key_filename=key_files,  # type: ignore[arg-type]  # a list works; the stubs say str
                allow_agent=ep.use_agent,
                look_for_keys=not ep.key_files,
                sock=sock,
                timeout=self._connect_timeout,
                banner_timeout=self._connect_timeout,
            )
        except BaseException as e:
            client.close()
            sock.close()
            if isinstance(e, paramiko.BadHostKeyException):
                raise self._changed_key(ep, e) from None
            if isinstance(e, paramiko.AuthenticationException):
                raise self._auth_failed(ep, e, where) from None
            if isinstance(e, (paramiko.SSHException, OSError, EOFError)) and ep.proxy_command and via is None:
                raise HostError(
                    self.host,
                    f"{where}SSH handshake with {ep} failed: {self._proxies[-1].failure()}",
                    hint=f"try the command yourself: ssh -o ProxyCommand='{ep.proxy_command}' {ep.alias} true",
                ) from e
            if isinstance(e, (paramiko.SSHException, OSError, EOFError)):
                raise HostError(
                    self.host,
                    f"{where}SSH handshake with {ep} failed: {str(e) or type(e).__name__}",
                    hint=f"is an SSH server listening on {ep.hostname} port {ep.port}?",
                ) from e
            raise
        if self._keepalive > 0:
            _connection(client).set_keepalive(max(1, round(self._keepalive)))
        return client

    def _socket(self, ep: _Endpoint) -> socket.socket:
        if ep.proxy_command:
            try:
                self._proxies.append(Proxy(ep.proxy_command))
            except OSError as e:
                raise HostError(self.host, f"cannot start the ProxyCommand for {ep.alias}: {e}") from e
            return self._proxies[-1].sock
        reach = f"cannot reach {ep}"
        try:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=self._connect_timeout)
        except (socket.gaierror, UnicodeError) as e:  # UnicodeError: not a valid DNS name at all
            raise HostError(
                self.host,
                f"cannot resolve {ep.hostname}: {getattr(e, 'strerror', None) or e}",
                hint=f"check the name, or set its HostName in {self._ssh_config_path}",
            ) from e
        except (TimeoutError, socket.timeout) as e:
            raise HostError(
                self.host, f"{reach}: timed out after {self._connect_timeout:g}s (firewall or host down?)"
            ) from e
        except ConnectionRefusedError as e:
            raise HostError(self.host, f"{reach}: connection refused (is sshd running on port {ep.port}?)") from e
        except OSError as e:
            raise HostError(self.host, f"{reach}: {e.strerror or e}") from e
        if self._keepalive > 0 and hasattr(socket, "TCP_USER_TIMEOUT"):
            # Keepalives are sent every `keepalive` s; unacknowledged for 3 of those means the
            # link is gone (like ServerAliveCountMax=3), so streams end instead of hanging.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(self._keepalive * 3000))
        return sock

    def _tunnel(self, ep: _Endpoint, via: _Endpoint) -> paramiko.Channel:
        """A direct-tcpip channel from the jump host `via` (connected last) to `ep`."""
        try:
            return _connection(self._clients[-1]).open_channel(
                "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=self._connect_timeout
            )
        except paramiko.ChannelException as e:
            raise HostError(
                self.host,
                f"jump host {via} cannot reach {ep}: {e.text}",
                hint=f"is sshd running on {ep.hostname} port {ep.port}, and may {via.alias} connect to it?",
            ) from e
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise HostError(
                self.host,
                f"jump host {via} cannot reach {ep}: {str(e) or type(e).__name__}",
                hint=f"gave up after {self._connect_timeout:g}s; firewall or host down?",
            ) from e

    def _changed_key(self, ep: _Endpoint, e: paramiko.BadHostKeyException) -> HostError:
        files = [p for p in dict.fromkeys(ep.known_hosts + (self._pin_file,)) if p.exists()]
        fix = "; ".join(f"ssh-keygen -R '{ep.known_name}' -f {p}" for p in files)
        return HostError(
            self.host,
            f"host key for {ep.known_name} has CHANGED: known {_fingerprint(e.expected_key)}, "
            f"server now offers {_fingerprint(e.key)}; someone may be intercepting the "
            f"connection, or the host was reinstalled",
            hint=f"tfctl never replaces a known key; if the change is expected, remove the old "
            f"one ({fix}) and connect again",
        )

    def _auth_failed(self, ep: _Endpoint, e: paramiko.AuthenticationException, where: str) -> HostError:
        tried = []
        if ep.use_agent:
            try:
                agent = paramiko.Agent()
                tried.append(f"ssh-agent ({len(agent.get_keys())} keys)")
                agent.close()
            except (paramiko.SSHException, OSError):
                tried.append("ssh-agent (unreachable)")
        tried += [k if os.path.exists(k) else f"{k} (missing)" for k in ep.key_files]
        if not ep.key_files:
            tried += [p for p in map(os.path.expanduser, DEFAULT_IDENTITIES) if os.path.exists(p)]
        return HostError(
            self.host,
            f"{where}{ep.user}@{ep} refused authentication ({e}); tried: {', '.join(tried) or 'no keys'}",
            hint=f"add one of these public keys to ~{ep.user}/.ssh/authorized_keys on {ep.hostname} "
            f"(ssh-copy-id -i KEY -p {ep.port} {ep.user}@{ep.hostname}), load the right key into "
            f"ssh-agent, or set User/IdentityFile for {ep.alias} in {self._ssh_config_path}",
        )


def connect(transport: SSHTransport) -> None:
    """Connect `transport` now instead of at its first command: the handshake, host key check and
    authentication, through every jump host; nothing if it is connected. Raises HostError as a
    command would. For timing or checking the connection alone (bench/micro.py). A function, not
    a method: every transport has the same methods, and the others have no connection to make."""
    transport._transport()


def _reading_stdin_to_the_end(command: str) -> str:
    """`command`, then a read of whatever it left of its stdin, before the session ends.

    paramiko may send a channel's stdin EOF (or data) after the CLOSE it sends in answer to the
    server's (paramiko#1115), and OpenSSH answers that by dropping the connection, with every
    other command on it. A session that ends only once our EOF arrived never closes first. The
    subshell keeps an `exit` in `command` from skipping the read; its status is the session's.
    """
    return f"({command}\n); tfctl_status=$?; cat >/dev/null; exit $tfctl_status"


def _connection(client: paramiko.SSHClient) -> paramiko.Transport:
    """The transport of a client that connected: paramiko types it optional, it is not then."""
    transport = client.get_transport()
    assert transport is not None
    return transport


def _spawn(target: Callable, *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _read_all(recv: Callable[[int], bytes], into: list[bytes]) -> None:
    while data := recv(CHUNK):
        into.append(data)


def _feed(chan: paramiko.Channel, data: bytes | None) -> None:
    """Write stdin and close it; a command that exits without reading it is not an error."""
    try:
        if data:
            chan.sendall(data)
        chan.shutdown_write()
    except OSError:
        pass
