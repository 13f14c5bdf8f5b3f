"""SshExecutor (paramiko): host keys checked against known_hosts, bounded retries, errors naming the host.

The only module that imports paramiko; every paramiko or socket exception leaving it is an ExecError.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import paramiko

from k3deploy.errors import ExecError
from k3deploy.executors.base import CommandResult
from k3deploy.executors.hostkeys import (
    AcceptNewPolicy,
    RejectUnknownPolicy,
    UnknownHostKey,
    changed_key_error,
    trust_known,
)
from k3deploy.executors.posix import ShellExecutor, as_shell
from k3deploy.executors.ssh_config import SshEndpoint, resolve
from k3deploy.executors.target import ExecTarget

# Retried: the network or an overloaded sshd. Never retried: authentication and host keys.
CONNECT_ATTEMPTS = 3
BACKOFF_S = (0.5, 1.5)
_RETRYABLE = (OSError, EOFError, paramiko.SSHException)

if not os.environ.get("K3DEPLOY_DEBUG"):
    # paramiko logs every failed handshake at ERROR with a traceback; we report it once, translated.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class SshExecutor(ShellExecutor):
    """One paramiko connection to one host; thread-safe for concurrent commands (one channel each)."""

    def __init__(self, target: ExecTarget) -> None:
        self.target = target
        self.host = target.host
        # A host that stops answering mid-deployment is noticed on the scale of the connect timeout.
        self.control_timeout_s = max(5.0, 2 * target.connect_timeout_s)
        self._endpoint: SshEndpoint | None = None
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

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
            self._client = self._connect()

    def _connect(self) -> paramiko.SSHClient:
        ep, t = self.endpoint, self.target
        last: Exception | None = None
        for attempt in range(CONNECT_ATTEMPTS):
            if attempt:
                time.sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
            client = paramiko.SSHClient()
            try:
                trust_known(client, (*ep.extra_known_hosts, ep.known_hosts), ep.hostname, ep.port)
                policy = AcceptNewPolicy(ep.known_hosts) if t.accept_new_host_keys else RejectUnknownPolicy(ep)
                client.set_missing_host_key_policy(policy)
                pkey = _load_key(ep.key_files[0]) if len(ep.key_files) == 1 else None
                sock = open_socket(ep.hostname, ep.port, t.connect_timeout_s)
                client.connect(
                    ep.hostname, port=ep.port, username=ep.user, pkey=pkey, sock=sock,
                    key_filename=None if pkey is not None else list(ep.key_files) or None,
                    timeout=t.connect_timeout_s, banner_timeout=t.connect_timeout_s,
                    auth_timeout=t.connect_timeout_s, allow_agent=True, look_for_keys=not ep.key_files,
                )  # fmt: skip
                return client
            except UnknownHostKey as exc:
                client.close()
                raise ExecError(str(exc), host=self.host, hint=exc.hint) from None
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise changed_key_error(self.host, ep, exc) from None
            except paramiko.AuthenticationException as exc:
                client.close()
                keys = ", ".join(ep.key_files) or "agent and ~/.ssh/id_*"
                raise ExecError(f"authentication failed as {ep.user} ({keys}): {exc}", host=self.host,
                                hint="check the user and key (node ssh:, launch.ssh, --ssh-user/--ssh-key)") from None
            except socket.gaierror as exc:
                client.close()
                raise ExecError(f"cannot resolve {ep.hostname}: {exc.strerror}", host=self.host) from None
            except _RETRYABLE as exc:
                client.close()
                last = exc
        raise ExecError(f"cannot connect to {ep.label} after {CONNECT_ATTEMPTS} attempts "
                        f"(timeout {t.connect_timeout_s:g} s each): {_describe(last)}", host=self.host) from None

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

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0) -> CommandResult:
        """Run a command without a pty; stdout and stderr are read together so neither can block."""
        deadline = time.monotonic() + timeout_s
        chan = self._session(timeout_s)
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(as_shell(command))
            chan.shutdown_write()
            for _ in range(10**9):  # ends at exit status + EOF, or the deadline
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and chan.eof_received and not chan.recv_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close()  # the connection may be dead without knowing it: reconnect next time
                    raise ExecError(f"command timed out after {timeout_s:g} s", host=self.host)
                select.select([chan], [], [], min(left, 0.5))
            code = chan.recv_exit_status()
        except _RETRYABLE as exc:
            raise ExecError(f"command failed: {_describe(exc)}", host=self.host) from None
        finally:
            chan.close()
        return CommandResult(exit_code=code, stdout=out.decode(errors="replace"),
                             stderr=err.decode(errors="replace"))

    def _stream(self, command: str, stop: threading.Event | None) -> Iterator[str]:
        chan = self._session(30.0)
        buf = b""
        try:
            chan.exec_command(command)
            chan.settimeout(0.25)
            for _ in range(10**9):  # ends when the remote command ends or `stop` is set
                if stop is not None and stop.is_set():
                    return
                try:
                    chunk = chan.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if buf:
                yield buf.decode(errors="replace")
        except _RETRYABLE as exc:
            raise ExecError(f"log stream failed: {_describe(exc)}", host=self.host) from None
        finally:
            chan.close()

    def put_file(self, local_path: str, remote_path: str) -> None:
        """Copy a file over SFTP."""
        self.connect()
        assert self._client is not None
        try:
            with self._client.open_sftp() as sftp:
                sftp.put(local_path, remote_path)
        except _RETRYABLE as exc:
            raise ExecError(f"copy {local_path} -> {remote_path}: {_describe(exc)}", host=self.host) from None

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges every segment at once.

    After authentication sshd sends its host-key announcement and, right behind it, the reply to our first
    channel open; with Nagle on (sshd only disables it for interactive sessions) that reply waits for our
    ACK of the first, which Linux delays by 40 ms. Twice per connection (auth, first session) that was 80 ms
    of a ~125 ms connect+command on a LAN. Quick-ack mode is not sticky, so it is re-armed before each read.
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if _QUICKACK is not None:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return super().recv(bufsize, flags)


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only


def open_socket(hostname: str, port: int, timeout_s: float) -> socket.socket:
    """A connected TCP socket (IPv4 or IPv6, first address that answers) with Nagle off and quick ACKs."""
    last: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM):
        sock = QuickAckSocket(family, kind, proto)
        try:
            sock.settimeout(timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"no address for {hostname}")


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


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError | paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if exc is None:
        return "unknown error"
    return str(exc) or type(exc).__name__
