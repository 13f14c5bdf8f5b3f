"""SshExecutor (paramiko): host keys checked against known_hosts, bounded retries, errors naming the host.

The only module that imports paramiko; every paramiko or socket exception leaving it is an ExecError.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator

import paramiko

from k3deploy.errors import CommandTimeout, ExecError
from k3deploy.executors.base import CommandResult, Forward, LineSink
from k3deploy.executors.hostkeys import (
    AcceptNewPolicy,
    RejectUnknownPolicy,
    UnknownHostKey,
    changed_key_error,
    trust_known,
)
from k3deploy.executors.jumps import JumpPool
from k3deploy.executors.posix import LineSplitter, ShellExecutor, split_lines
from k3deploy.executors.ssh_config import SshEndpoint, resolve, split_hop
from k3deploy.executors.target import SshTarget
from k3deploy.executors.tcp import open_socket
from k3deploy.executors.tunnel import Tunnel

# sshd starts each session's shell in a new session (setsid), so a command and all it spawns share one
# process group: the wrapper prints that group's id as the first stderr line (`k3pgid N`) (read from /proc, shell
# builtins only), so that a command that times out is killed as a whole, as on the other executors
# (closing the channel alone leaves it running: no pty, no SIGHUP).
# Prints the command's process group to stderr before anything runs. That first write is also what keeps a
# session that stalled before its command (a hung home directory, a slow PAM module) from running it after we
# gave up and closed the channel: the write fails (SIGPIPE) and the command never starts. Keep it first.
_GROUP_WRAPPER = (
    "sh -c 'c=$1; read -r st < /proc/$$/stat && st=${st##*\")\"} && set -- $st && echo \"k3pgid $3\" >&2; "
    "exec sh -c \"$c\"' k3deploy "
)
KILL_TIMEOUT_S = 5.0
# How often an idle connection's reader thread, and a follower of a quiet log, wake to see whether they were
# closed or asked to stop (data wakes them at once).
IDLE_WAKE_S = 1.0
STREAM_WAKE_S = 0.5

# Retried: the network or an overloaded sshd. Never retried: authentication and host keys.
CONNECT_ATTEMPTS = 3
BACKOFF_S = (0.5, 1.5)
_RETRYABLE = (OSError, EOFError, paramiko.SSHException)

if not os.environ.get("K3DEPLOY_DEBUG"):
    # paramiko logs every failed handshake at ERROR with a traceback; we report it once, translated.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class SshExecutor(ShellExecutor):
    """One paramiko connection to one host; thread-safe for concurrent commands (one channel each)."""

    capabilities = SshTarget.capabilities

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self.host = target.host
        # A host that stops answering mid-deployment is noticed on the scale of the connect timeout.
        self.control_timeout_s = max(5.0, 2 * target.connect_timeout_s)
        self._endpoint: SshEndpoint | None = None
        self._client: paramiko.SSHClient | None = None
        self._hop_keys: list[tuple[object, ...]] = []  # shared jump-host connections this one runs through
        self._lock = threading.Lock()
        # `close` while a connect is under way (Ctrl-C, a teardown) ends it now, not after every attempt's
        # timeout: it sets `_abort` and closes the clients still in their handshake (a connect holds `_lock`).
        self._abort = threading.Event()
        self._handshaking: set[paramiko.SSHClient] = set()
        self._handshaking_lock = threading.Lock()

    @property
    def endpoint(self) -> SshEndpoint:
        """Resolved address, user, keys (reads ~/.ssh/config once)."""
        if self._endpoint is None:
            self._endpoint = resolve(self.target)
        return self._endpoint

    def connect(self) -> None:
        """Connect and authenticate, retrying connection errors with backoff."""
        with self._lock:
            if self._client is not None and _active(self._client):
                return
            if self._client is not None:
                self._client.close()  # a dead connection: free its transport before making a new one
                self._client = None
            self._client = self._connect()

    def _connect(self) -> paramiko.SSHClient:
        """The chain of jump hosts (if any), then the node; every attempt retries the whole chain."""
        ep, t = self.endpoint, self.target
        chain = [*(self._hop(spec) for spec in ep.jump), ep]
        last: Exception | None = None
        where = chain[0]
        for attempt in range(CONNECT_ATTEMPTS):
            if attempt and self._abort.wait(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)]):
                break
            self._close_hops()
            via: paramiko.SSHClient | None = None
            try:
                for i, step in enumerate(chain):
                    where = step
                    if step is ep:
                        return self._handshake(step, via)
                    key = (tuple(chain[: i + 1]), t.accept_new_host_keys)
                    via = JUMPS.acquire(key, functools.partial(self._handshake, step, via))
                    self._hop_keys.append(key)
            except ExecError:
                self._close_hops()
                raise
            except _RETRYABLE as exc:
                last = exc
            if self._abort.is_set():
                break
        self._close_hops()
        if self._abort.is_set():
            raise ExecError(f"connecting to {self._label(where)} was given up: the connection was closed",
                            host=self.host)
        direct = not ep.jump and not ep.proxy_command
        raise ExecError(f"cannot connect to {self._label(where)} after {CONNECT_ATTEMPTS} attempts "
                        f"(timeout {t.connect_timeout_s:g} s each): {_describe(last)}", host=self.host,
                        hint="a node reachable only through a bastion needs launch.ssh.jump, --ssh-jump or "
                             "ProxyJump in ~/.ssh/config" if direct else None) from None

    def _hop(self, spec: str) -> SshEndpoint:
        """A jump host's endpoint: its own ~/.ssh/config entry; without an IdentityFile there, the node's key."""
        user, host, port = split_hop(spec)
        t = self.target
        hop = resolve(SshTarget(host=host, user=user, port=port, known_hosts=t.known_hosts,
                                 ssh_config=t.ssh_config, accept_new_host_keys=t.accept_new_host_keys,
                                 connect_timeout_s=t.connect_timeout_s, jump="none"))
        if not hop.key_files and self.endpoint.key_files:
            hop = dataclasses.replace(hop, key_files=self.endpoint.key_files)
        return hop

    def _label(self, step: SshEndpoint) -> str:
        if step is self.endpoint:
            return step.label
        return f"jump host {step.label} (on the way to {self.endpoint.label})"

    def _handshake(self, step: SshEndpoint, via: paramiko.SSHClient | None) -> paramiko.SSHClient:
        """Connect and authenticate to one endpoint: directly, through `via`'s connection, or through the
        config's ProxyCommand; errors that a retry cannot fix become ExecErrors naming the step."""
        t = self.target
        client = paramiko.SSHClient()
        with self._handshaking_lock:
            self._handshaking.add(client)
        try:
            trust_known(client, (*step.extra_known_hosts, step.known_hosts), step.hostname, step.port)
            policy = AcceptNewPolicy(step.known_hosts) if t.accept_new_host_keys else RejectUnknownPolicy(step)
            client.set_missing_host_key_policy(policy)
            pkey = _load_key(step.key_files[0]) if len(step.key_files) == 1 else None
            sock = self._sock(step, via)
            if self._abort.is_set():
                sock.close()
                raise paramiko.SSHException("closed while connecting")
            client.connect(
                step.hostname, port=step.port, username=step.user, pkey=pkey, sock=sock,
                key_filename=None if pkey is not None else list(step.key_files) or None,
                timeout=t.connect_timeout_s, banner_timeout=t.connect_timeout_s,
                auth_timeout=t.connect_timeout_s, allow_agent=True, look_for_keys=not step.key_files,
            )  # fmt: skip
            transport = client.get_transport()
            if transport is not None:
                # paramiko's reader thread wakes every 0.1 s to check for a close; across the connections a
                # supervisor keeps open for days that is most of its CPU. Data still wakes it at once.
                transport.sock.settimeout(IDLE_WAKE_S)
            return client
        except UnknownHostKey as exc:
            client.close()
            raise ExecError(str(exc), host=self.host, hint=exc.hint) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise changed_key_error(self.host, step, exc) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            keys = ", ".join(step.key_files) or "agent and ~/.ssh/id_*"
            raise ExecError(f"authentication failed as {step.user} at {self._label(step)} ({keys}): {exc}",
                            host=self.host, hint="check the user and key (node ssh:, launch.ssh, "
                            "--ssh-user/--ssh-key; a jump host's own in ~/.ssh/config or user@ in the hop)") from None
        except socket.gaierror as exc:
            client.close()
            raise ExecError(f"cannot resolve {step.hostname} ({self._label(step)}): {exc.strerror}",
                            host=self.host) from None
        except _RETRYABLE:
            client.close()
            raise
        finally:
            with self._handshaking_lock:
                self._handshaking.discard(client)

    def _sock(self, step: SshEndpoint,
              via: paramiko.SSHClient | None) -> socket.socket | paramiko.Channel | paramiko.ProxyCommand:
        t = self.target
        if via is not None:
            transport = via.get_transport()
            if transport is None:
                raise paramiko.SSHException("the jump host closed the connection")
            # The jump host opens the TCP connection: the node's name or address is resolved there.
            return transport.open_channel("direct-tcpip", (step.hostname, step.port), ("127.0.0.1", 0),
                                          timeout=t.connect_timeout_s)
        if step.proxy_command:
            return paramiko.ProxyCommand(step.proxy_command)
        return open_socket(step.hostname, step.port, t.connect_timeout_s)

    def _close_hops(self) -> None:
        for key in reversed(self._hop_keys):
            JUMPS.release(key)
        self._hop_keys.clear()

    def _session(self, timeout_s: float) -> paramiko.Channel:
        self.connect()
        assert self._client is not None
        try:
            transport = self._client.get_transport()
            if transport is None:
                raise paramiko.SSHException("connection closed")
            return transport.open_session(timeout=timeout_s)
        except _RETRYABLE as exc:
            raise ExecError(f"cannot open a session: {_describe(exc)}", host=self.host) from None

    def _run(self, command: str, timeout_s: float, on_line: LineSink | None) -> CommandResult:
        """Run a command without a pty; stdout and stderr are read together so neither can block."""
        deadline = time.monotonic() + timeout_s
        chan = self._session(timeout_s)
        out, err = bytearray(), bytearray()
        lines = LineSplitter(on_line)
        try:
            chan.exec_command(_GROUP_WRAPPER + shlex.quote(command))
            chan.shutdown_write()
            for _ in range(10**9):  # ends at exit status + EOF, or the deadline
                while chan.recv_ready():
                    chunk = chan.recv(65536)
                    out += chunk
                    lines.feed(chunk)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and chan.eof_received and not chan.recv_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill_group(_leader(err))
                    self.close()  # the connection may be dead without knowing it: reconnect next time
                    raise CommandTimeout(f"command timed out after {timeout_s:g} s", host=self.host)
                select.select([chan], [], [], min(left, 0.5))
            code = chan.recv_exit_status()
            lines.flush()
            _leader(err)  # drop the wrapper's line
        except _RETRYABLE as exc:
            raise ExecError(f"command failed: {_describe(exc)}", host=self.host) from None
        finally:
            chan.close()
        return CommandResult(exit_code=code, stdout=out.decode(errors="replace"),
                             stderr=err.decode(errors="replace"))

    def _kill_group(self, pgid: int | None) -> None:
        """SIGKILL a timed-out command's process group (closing the channel alone leaves it running)."""
        if pgid is None:
            return
        try:
            chan = self._session(KILL_TIMEOUT_S)
            chan.exec_command(f"kill -9 -{int(pgid)} 2>/dev/null")
            chan.settimeout(KILL_TIMEOUT_S)
            chan.recv_exit_status()
            chan.close()
        except (*_RETRYABLE, ExecError):
            pass  # the host is gone or wedged: nothing more can be done from here

    def _stream(self, command: str, stop: threading.Event | None) -> Iterator[str]:
        chan = self._session(30.0)

        def read_chunk() -> bytes | None:
            try:
                return chan.recv(65536)
            except TimeoutError:
                return None

        try:
            chan.exec_command(command)
            chan.settimeout(STREAM_WAKE_S)
            yield from split_lines(read_chunk, stop)
        except _RETRYABLE as exc:
            raise ExecError(f"log stream failed: {_describe(exc)}", host=self.host) from None
        finally:
            chan.close()

    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a file over SFTP."""
        self._sftp(lambda sftp: sftp.put(local_path, remote_path), f"copy {local_path} -> {remote_path}")

    def get(self, remote_path: str, local_path: str) -> None:
        """Copy a file of the host over SFTP."""
        self._sftp(lambda sftp: sftp.get(remote_path, local_path), f"copy {remote_path} -> {local_path}")

    def _sftp(self, action: Callable[[paramiko.SFTPClient], object], what: str) -> None:
        self.connect()
        assert self._client is not None
        try:
            with self._client.open_sftp() as sftp:
                action(sftp)
        except (*_RETRYABLE, paramiko.SFTPError) as exc:
            raise ExecError(f"{what}: {_describe(exc)}", host=self.host) from None

    def forward(self, remote_host: str, remote_port: int) -> Forward:
        """A local port whose connections the node opens to remote_host:remote_port (direct-tcpip through
        this connection, so through any jump hosts too)."""
        self.connect()

        def open_channel(peer: tuple[str, int]) -> paramiko.Channel:
            assert self._client is not None
            transport = self._client.get_transport()
            if transport is None:
                raise paramiko.SSHException("connection closed")
            return transport.open_channel("direct-tcpip", (remote_host, remote_port), peer,
                                          timeout=self.target.connect_timeout_s)

        return Tunnel(open_channel, f"{self.host} -> {remote_host}:{remote_port}")

    def close(self) -> None:
        """Close the connection; a connect under way in another thread gives up at once."""
        self._abort.set()
        with self._handshaking_lock:
            pending = list(self._handshaking)
        for client in pending:
            client.close()  # its transport stops: the handshake fails within paramiko's 0.1 s poll
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
            self._close_hops()
            self._abort.clear()  # the executor may connect again later


_KEYS: dict[str, paramiko.PKey | None] = {}


def _load_key(path: str) -> paramiko.PKey | None:
    """A private key read once per process; None (let paramiko try, e.g. for a passphrase) if unreadable."""
    if path not in _KEYS:
        try:
            _KEYS[path] = paramiko.PKey.from_path(path)
        except (OSError, ValueError, paramiko.SSHException):
            _KEYS[path] = None
    return _KEYS[path]


def _active(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


# Every node behind the same jump chain (in this process) rides one connection to each hop.
JUMPS = JumpPool(_active)


def _leader(err: bytearray) -> int | None:
    """Remove the wrapper's first stderr line (the command's process group id) and return it."""
    head, sep, rest = bytes(err).partition(b"\n")
    pgid = head.removeprefix(b"k3pgid ")
    if not sep or pgid == head or not pgid.isdigit():
        return None
    err[:] = rest
    return int(pgid)


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError | paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if exc is None:
        return "unknown error"
    return str(exc) or type(exc).__name__
