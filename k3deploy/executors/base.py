"""The Executor interface: the one seam between k3deploy and the machines it runs commands on."""
from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from k3deploy.executors.target import Capabilities

# Every process k3deploy starts carries this variable; signals go to a process group only when a live
# member still carries the value, so a reused PID is never signalled.
TAG_VAR = "K3DEPLOY_RUN"

# The session leader is this wrapper: it outlives a graceful engine shutdown (a trap, not an ignored
# signal, so the engine still gets default TERM handling) and then writes the exit status and time into
# the log, which is how a gang failure is traced to the node that died first.
EXIT_MARK = "[k3deploy] exited with status"
_EXIT_RE = re.compile(re.escape(EXIT_MARK) + r" (\d+) at ([0-9.]+)")


def sh(script: str) -> str:
    """A script wrapped for any login shell (bash, zsh, fish all pass one quoted word to sh)."""
    return "sh -c " + shlex.quote(script)


def exit_record(log_text: str) -> tuple[int, float] | None:
    """(exit status, epoch seconds) from the wrapper's last line, if the process ended through it."""
    found = _EXIT_RE.findall(log_text)
    if not found:
        return None
    status, when = found[-1]
    return int(status), float(when)


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

    @model_validator(mode="before")
    @classmethod
    def _drop_agent_name(cls, data: Any) -> Any:
        # Records before 0.3 held the Ray agent's name in `container`; the Ray executor derives it from `tag`.
        if isinstance(data, dict) and "container" in data:
            return {k: v for k, v in data.items() if k != "container"}
        return data


class Forward(Protocol):
    """A port of the node reachable from this machine: connect to (local_host, local_port)."""

    local_host: str
    local_port: int

    def close(self) -> None:
        """Stop forwarding (connections in flight end too); idempotent."""
        ...


LineSink = Callable[[str], None]


@runtime_checkable
class Executor(Protocol):
    """Runs commands and detached processes on one host.

    The contract every implementation honours by behaviour (tests/executor_contract.py runs the same
    tests against local, SSH and Ray):
    - every failure to reach the host or to run something there is an ExecError naming the host;
    - `run` returns the command's exit code, stdout and stderr (a non-zero exit is a result, not an error);
      past `timeout_s` the command's whole process session is killed and `CommandTimeout` is raised;
      `env` entries are set for that command only; `on_line` sees each stdout line as it arrives
      (Ray: when the command has ended), and stdout is still returned whole;
    - `start` returns at once; the process runs in its own session (process group), detached from the
      connection, stdout+stderr to `log_path`; `alive`/`signal` act on exactly that process group
      (tag-guarded against PID reuse); `terminate` is the whole stop of that group (TERM, grace, KILL) in
      one round trip; `follow` yields log lines until the process ends or `stop` is set;
    - `put` and `get` copy whole files to and from the node;
    - `capabilities` tells what differs between kinds (each is asserted by the behaviour suite);
    - `forward` makes a port reachable as the node sees it (its loopback or its private network) from this
      machine, or returns None when this executor cannot (Ray): HTTP checks then run on the node.
    """

    host: str
    capabilities: Capabilities  # what it can do (streams logs, forwards ports, ...): ask this, not the kind

    def connect(self) -> None:
        """Open the connection now (later calls reuse it); raises ExecError naming the host."""
        ...

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0, *,
            env: Mapping[str, str] | None = None, on_line: LineSink | None = None) -> CommandResult:
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

    def terminate(self, handle: ProcessHandle, grace_s: float) -> bool:
        """SIGTERM the group, wait up to `grace_s`, SIGKILL what is left (one round trip); True once nothing
        of it is left (also when nothing was), False when something survived SIGKILL."""
        ...

    def read_log(self, handle: ProcessHandle, tail_lines: int = 50) -> str:
        """The last lines of the process's log ('' when there is none yet)."""
        ...

    def follow(
        self, handle: ProcessHandle, tail_lines: int = 10, stop: threading.Event | None = None
    ) -> Iterator[str]:
        """Lines of the log as they are written, until the process ends or `stop` is set."""
        ...

    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a local file to the host."""
        ...

    def get(self, remote_path: str, local_path: str) -> None:
        """Copy a file of the host to this machine."""
        ...

    def forward(self, remote_host: str, remote_port: int) -> Forward | None:
        """A local endpoint connected to remote_host:remote_port as the node reaches it; None: cannot."""
        ...

    def close(self) -> None:
        """Release connections; idempotent."""
        ...
