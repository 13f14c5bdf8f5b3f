"""SshExecutor (paramiko): commands, detached processes, log streams, files and tunnels over one connection to
one host (made by ssh_connect: host keys checked, bounded retries).

With ssh_connect, the only modules that import paramiko; every paramiko or socket exception leaving them is
an ExecError.
"""
from __future__ import annotations

import select
import shlex
import threading
import time
from collections.abc import Callable, Iterator

import paramiko

from k3deploy.errors import CommandTimeout, ExecError
from k3deploy.executors.base import CommandResult, Forward, LineSink
from k3deploy.executors.posix import LineSplitter, ShellExecutor, split_lines
from k3deploy.executors.ssh_connect import RETRYABLE, SshConnector, active, describe
from k3deploy.executors.target import SshTarget
from k3deploy.executors.tunnel import Tunnel

# A forwarded connection's channel: opened this many times when the connection was found dead or the node did not
# answer the open in time (a refusal by the node is its answer: not tried again).
CHANNEL_TRIES = 2
CHANNEL_RETRY_S = 0.5

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
# How often a follower of a quiet log wakes to see whether it was asked to stop (data wakes it at once).
STREAM_WAKE_S = 0.5


class SshExecutor(ShellExecutor):
    """One paramiko connection to one host; thread-safe for concurrent commands (one channel each)."""

    capabilities = SshTarget.capabilities

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self.host = target.host
        # A host that stops answering mid-deployment is noticed on the scale of the connect timeout.
        self.control_timeout_s = max(5.0, 2 * target.connect_timeout_s)
        self._connector = SshConnector(target)
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()  # held by a connect: `close` aborts it through the connector

    def connect(self) -> None:
        """Connect and authenticate, retrying connection errors with backoff."""
        with self._lock:
            if self._client is not None and active(self._client):
                return
            if self._client is not None:
                self._client.close()  # a dead connection: free its transport before making a new one
                self._client = None
            self._client = self._connector.connect()

    def _session(self, timeout_s: float) -> paramiko.Channel:
        self.connect()
        assert self._client is not None
        try:
            transport = self._client.get_transport()
            if transport is None:
                raise paramiko.SSHException("connection closed")
            return transport.open_session(timeout=timeout_s)
        except RETRYABLE as exc:
            raise ExecError(f"cannot open a session: {describe(exc)}", host=self.host) from None

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
        except RETRYABLE as exc:
            raise ExecError(f"command failed: {describe(exc)}", host=self.host) from None
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
        except (*RETRYABLE, ExecError):
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
        except RETRYABLE as exc:
            raise ExecError(f"log stream failed: {describe(exc)}", host=self.host) from None
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
        except (*RETRYABLE, paramiko.SFTPError) as exc:
            raise ExecError(f"{what}: {describe(exc)}", host=self.host) from None

    def forward(self, remote_host: str, remote_port: int) -> Forward:
        """A local port whose connections the node opens to remote_host:remote_port (direct-tcpip through
        this connection, so through any jump hosts too)."""
        self.connect()

        def open_channel(peer: tuple[str, int]) -> paramiko.Channel:
            late: paramiko.SSHException | EOFError | None = None
            for _ in range(CHANNEL_TRIES):
                if late is not None:
                    time.sleep(CHANNEL_RETRY_S)
                # A connection found dead since the forward began ("SSH session not active": a clean-clone
                # run's `short` stage failed on it twice, then the next stage reconnected) is made again here.
                self.connect()
                client = self._client
                transport = client.get_transport() if client is not None else None
                if transport is None:
                    raise paramiko.SSHException("connection closed")
                try:
                    return transport.open_channel("direct-tcpip", (remote_host, remote_port), peer,
                                                  timeout=self.target.connect_timeout_s)
                except paramiko.ChannelException:
                    raise  # the node's answer: it could not connect there (refused, unreachable)
                except (paramiko.SSHException, EOFError) as exc:  # a dead connection, or no answer in time
                    late = exc
            assert late is not None
            raise late

        return Tunnel(open_channel, f"{self.host} -> {remote_host}:{remote_port}")

    def close(self) -> None:
        """Close the connection; a connect under way in another thread gives up at once."""
        self._connector.abort()
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
            self._connector.release_hops()
            self._connector.rearm()  # the executor may connect again later


def _leader(err: bytearray) -> int | None:
    """Remove the wrapper's first stderr line (the command's process group id) and return it."""
    head, sep, rest = bytes(err).partition(b"\n")
    pgid = head.removeprefix(b"k3pgid ")
    if not sep or pgid == head or not pgid.isdigit():
        return None
    err[:] = rest
    return int(pgid)
