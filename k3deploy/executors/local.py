"""LocalExecutor: the node is this machine (the demo, unit tests); same scripts as over SSH."""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

from k3deploy.errors import ExecError
from k3deploy.executors.base import CommandResult
from k3deploy.executors.posix import ShellExecutor, as_shell, split_lines


class LocalExecutor(ShellExecutor):
    """Runs commands as local subprocesses, each in its own session so a timeout kills all of it."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host

    def connect(self) -> None:
        """Nothing to open."""

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0) -> CommandResult:
        """Run through /bin/sh; a timeout kills the command's whole session and raises ExecError."""
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", as_shell(command)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise ExecError(f"cannot run a command: {exc}", host=self.host) from exc
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise ExecError(f"command timed out after {timeout_s:g} s", host=self.host) from None
        return CommandResult(exit_code=proc.returncode, stdout=out, stderr=err)

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

    def put_file(self, local_path: str, remote_path: str) -> None:
        """Copy within this machine."""
        try:
            shutil.copyfile(local_path, remote_path)
        except OSError as exc:
            raise ExecError(f"copy {local_path} -> {remote_path}: {exc}", host=self.host) from exc

    def close(self) -> None:
        """Nothing to release."""


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
