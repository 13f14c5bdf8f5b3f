"""The Executor interface: the one seam between k3deploy and the machines it runs commands on."""
from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

# Every process k3deploy starts carries this variable; signals go to a process group only when a live
# member still carries the value, so a reused PID is never signalled.
TAG_VAR = "K3DEPLOY_RUN"


class CommandResult(BaseModel):
    """What a finished command left behind."""

    model_config = ConfigDict(frozen=True)

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """Exit status 0."""
        return self.exit_code == 0


class ProcessHandle(BaseModel):
    """A detached process on a host, as recorded in the deployment state (JSON round-trips)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(description="the host it runs on, as the topology names it")
    pid: int | None = Field(None, description="PID (= process group and session id) as seen on the host")
    start_ticks: int | None = Field(None, description="start time in clock ticks since boot (PID-reuse guard)")
    tag: str = Field(description=f"value of {TAG_VAR} in the process's environment")
    log_path: str = Field(description="log file on the host (stdout and stderr)")
    container: str | None = Field(None, description="container or actor name, for executors that use one")


@runtime_checkable
class Executor(Protocol):
    """Runs commands and detached processes on one host; every failure to reach it is an ExecError."""

    host: str

    def connect(self) -> None:
        """Open the connection now (later calls reuse it); raises ExecError naming the host."""
        ...

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0) -> CommandResult:
        """Run a shell string or an argv (quoted for the shell) and wait for it."""
        ...

    def start(self, command: str, log_path: str, workdir: str = "/", tag: str = "") -> ProcessHandle:
        """Start a shell string detached in its own session, stdout+stderr to `log_path` on the host."""
        ...

    def alive(self, handle: ProcessHandle) -> bool:
        """True while the started process itself (the group leader) runs."""
        ...

    def signal(self, handle: ProcessHandle, sig: int) -> bool:
        """Send `sig` (0 = probe) to the whole process group; False when none of it is left."""
        ...

    def read_log(self, handle: ProcessHandle, tail_lines: int = 50) -> str:
        """The last lines of the process's log ('' when there is none yet)."""
        ...

    def follow(
        self, handle: ProcessHandle, tail_lines: int = 10, stop: threading.Event | None = None
    ) -> Iterator[str]:
        """Lines of the log as they are written, until the process ends or `stop` is set."""
        ...

    def put_file(self, local_path: str, remote_path: str) -> None:
        """Copy a local file to the host."""
        ...

    def close(self) -> None:
        """Release connections; idempotent."""
        ...
