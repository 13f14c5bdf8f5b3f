"""LocalExecutor: the node is this machine (the demo, unit tests); same scripts as over SSH."""
from __future__ import annotations

import os
import select
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from k3deploy.errors import CommandTimeout, ExecError
from k3deploy.executors.base import CommandResult, Forward, LineSink
from k3deploy.executors.posix import LineSplitter, ShellExecutor, split_lines
from k3deploy.executors.target import LocalTarget


class LocalExecutor(ShellExecutor):
    """Runs commands as local subprocesses, each in its own session so a timeout kills all of it."""

    capabilities = LocalTarget.capabilities

    def __init__(self, host: str = "localhost") -> None:
        self.host = host
        # Commands under way, ended by close() as closing an SSH connection ends its sessions: a start
        # stalled on this host then starts nothing once the launch that asked for it has given up.
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed_during: set[subprocess.Popen[bytes]] = set()

    def connect(self) -> None:
        """Nothing to open."""

    def _run(self, command: str, timeout_s: float, on_line: LineSink | None) -> CommandResult:
        """Run through /bin/sh; a timeout kills the command's whole session and raises CommandTimeout."""
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise ExecError(f"cannot run a command: {exc}", host=self.host) from exc
        with self._lock:
            self._running.add(proc)
        try:
            res = self._collect(proc, timeout_s, on_line)
        finally:
            with self._lock:
                self._running.discard(proc)
                cut = proc in self._closed_during
                self._closed_during.discard(proc)
        if cut:
            raise ExecError("command failed: the executor was closed while it ran", host=self.host)
        return res

    def _collect(self, proc: subprocess.Popen[bytes], timeout_s: float, on_line: LineSink | None) -> CommandResult:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = bytearray(), bytearray()
        lines = LineSplitter(on_line)
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():  # until both pipes reach EOF, or the deadline
                left = deadline - time.monotonic()
                if left <= 0:
                    _kill_session(proc)
                    raise CommandTimeout(f"command timed out after {timeout_s:g} s", host=self.host)
                for key, _ in sel.select(min(left, 0.5)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.extend(chunk)
                    if key.data is out:
                        lines.feed(chunk)
        lines.flush()
        left = max(0.1, deadline - time.monotonic())
        try:
            code = proc.wait(left)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise CommandTimeout(f"command timed out after {timeout_s:g} s", host=self.host) from None
        finally:
            _kill_session(proc)  # closes the pipes (the command's own process has ended)
        return CommandResult(exit_code=code, stdout=out.decode(errors="replace"),
                             stderr=err.decode(errors="replace"))

    def _stream(self, command: str, stop: threading.Event | None) -> Iterator[str]:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        out = proc.stdout
        assert out is not None

        def read_chunk() -> bytes | None:
            ready, _, _ = select.select([out], [], [], 0.25)
            return os.read(out.fileno(), 65536) if ready else None

        try:
            yield from split_lines(read_chunk, stop)
        finally:
            _kill_session(proc)

    def put(self, local_path: str, remote_path: str) -> None:
        """Copy within this machine."""
        _copy(local_path, remote_path, self.host)

    def get(self, remote_path: str, local_path: str) -> None:
        """Copy within this machine."""
        _copy(remote_path, local_path, self.host)

    def forward(self, remote_host: str, remote_port: int) -> Forward:
        """The node is this machine: its ports are reachable as they are."""
        return DirectEndpoint(remote_host, remote_port)

    def close(self) -> None:
        """End every command still running (its whole session)."""
        with self._lock:
            running = [proc for proc in self._running if proc.poll() is None]
            self._closed_during.update(running)
        for proc in running:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class DirectEndpoint:
    """A port reached without forwarding."""

    local_host: str
    local_port: int

    def close(self) -> None:
        """Nothing to stop."""


def _copy(src: str, dst: str, host: str) -> None:
    try:
        shutil.copyfile(src, dst)
    except OSError as exc:
        raise ExecError(f"copy {src} -> {dst}: {exc}", host=host) from exc


def _kill_session(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
