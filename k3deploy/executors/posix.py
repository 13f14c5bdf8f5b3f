"""Process control on a POSIX host through small `sh -c` scripts; shared by the local and SSH executors.

Every value that reaches a script is `shlex.quote`d (or an int), and each script is passed as one quoted
argument to `sh -c`, so the host's login shell never interprets anything from a topology.
"""
from __future__ import annotations

import math
import posixpath
import re
import shlex
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence

from k3deploy.errors import ExecError
from k3deploy.executors.base import EXIT_MARK, TAG_VAR, CommandResult, Forward, LineSink, ProcessHandle, sh

# How long a process-control script may take; they are tiny, so this only bounds a wedged host (or a
# silently dropped connection, which otherwise blocks until TCP gives up).
CONTROL_TIMEOUT_S = 20.0
# How often a stop checks whether the group has gone after SIGTERM.
TERMINATE_STEP_S = 0.1
_TAG_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# The session leader is this wrapper: see EXIT_MARK in base.
_WRAPPER = (
    'trap : TERM INT HUP; sh -c "$1"; rc=$?; '
    f'printf "\\n{EXIT_MARK} %s at %s\\n" "$rc" "$(date +%s.%N)"; exit "$rc"'
)

# /proc/PID/stat into $1.. with shell builtins only (no fork: these scripts run on every poll):
# after the command name, field 1 is the state and field 20 the start time.
_STAT = 'read -r st 2>/dev/null < /proc/{pid}/stat && st=${{st##*")"}} && set -- $st'


def start_script(command: str, log_path: str, workdir: str, tag: str) -> str:
    """Detach `command` in its own session (setsid, no pty, full redirection: the channel closes at once);
    print `PID STARTTICKS`. A previous log is kept as LOG.1; a new log is 0600."""
    q = shlex.quote
    log = q(log_path)
    log_dir = q(posixpath.dirname(log_path) or "/")
    return (
        # Logs may hold what an engine prints about its secrets: 0600 in 0700 folders we make. The umask is
        # set in subshells only: the engine keeps the host's own for the files it writes.
        f"[ -d {log_dir} ] || (umask 077 && mkdir -p {log_dir}) || exit 96\n"
        f"if [ -e {log} ]; then mv -f {log} {log}.1; fi\n"
        f"(umask 077 && : > {log}) || exit 96\n"
        f"cd {q(workdir)} || exit 97\n"
        f"{TAG_VAR}={q(tag)} setsid nohup sh -c {q(_WRAPPER)} k3deploy {q(command)} > {log} 2>&1 < /dev/null &\n"
        "p=$!\n"
        f"{_STAT.format(pid='$p')}\n"  # if it fails, ${{20}} is empty: the PID alone still stops it
        'echo "$p ${20}"\n'
    )


def started_handle(host: str, res: CommandResult, log_path: str, workdir: str, tag: str) -> ProcessHandle:
    """The handle `start_script`'s output describes, or the ExecError saying why the start failed."""
    parts = res.stdout.split()
    if res.exit_code != 0 or not parts or not parts[0].isdigit():
        why = {96: f"cannot create the log directory of {log_path}", 97: f"cannot cd to {workdir}"}
        raise ExecError(why.get(res.exit_code, "detached start failed")
                        + f" (exit {res.exit_code}): {res.stderr.strip()[-500:]}", host=host)
    ticks = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return ProcessHandle(host=host, pid=int(parts[0]), start_ticks=ticks, tag=tag, log_path=log_path)


def alive_script(pid: int, start_ticks: int | None) -> str:
    """Exit 0 while the process runs (not a zombie) and is the one started at `start_ticks`."""
    check = f' && [ "${{20}}" = {int(start_ticks)} ]' if start_ticks is not None else ""
    return f'{_STAT.format(pid=int(pid))} || exit 1\n[ "$#" -ge 20 ] && [ "$1" != Z ]{check}\n'


def _tagged_fn(pgid: int, tag: str) -> str:
    """Shell function `tagged`: exit 0 while a live member of group `pgid` carries our tag (a zombie's
    environ is empty, so a dead leader not yet reaped does not count)."""
    return (
        "tagged() {\n"
        f"  for p in $(ps -e -o pid= -o pgid= | awk -v g={int(pgid)} '$2 == g {{print $1}}'); do\n"
        f"    if tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qxF {shlex.quote(f'{TAG_VAR}={tag}')}; then\n"
        "      return 0\n"
        "    fi\n"
        "  done\n"
        "  return 1\n"
        "}\n"
    )


def leader_script(tag: str) -> str:
    """Print `PID STARTTICKS` of the session leader carrying our tag (a process started elsewhere, e.g. by
    a Slurm job's task); exit 1 when there is none yet."""
    want = shlex.quote(f"{TAG_VAR}={tag}")
    return (
        "for d in /proc/[0-9]*; do\n"
        "  p=${d#/proc/}\n"
        f"  tr '\\0' '\\n' < \"$d/environ\" 2>/dev/null | grep -qxF {want} || continue\n"
        f"  {_STAT.format(pid='$p')} || continue\n"
        # field 4 is the session id: the wrapper start_script runs under setsid leads its own
        '  [ "$4" = "$p" ] && [ "$1" != Z ] && { echo "$p ${20}"; exit 0; }\n'
        "done\n"
        "exit 1\n"
    )


def signal_script(pgid: int, tag: str, sig: int) -> str:
    """Signal group `pgid` only if a live member still carries our tag; exit 1 when there is none."""
    return (
        _tagged_fn(pgid, tag)
        + "tagged || exit 1\n"
        # no `--`: dash's kill builtin rejects it; a negative number after the signal is the group.
        f"kill -{int(sig)} -{int(pgid)} 2>/dev/null; exit 0\n"
    )


def terminate_script(pgid: int, tag: str, grace_s: float) -> str:
    """The whole stop of one group in one command on the node: SIGTERM (if anything of it is left), wait up
    to `grace_s`, SIGKILL the rest; exit 0 once nothing carries the tag, 3 if something survived SIGKILL."""
    g, steps = int(pgid), max(1, math.ceil(grace_s / TERMINATE_STEP_S))
    nap = f"sleep {TERMINATE_STEP_S} 2>/dev/null || sleep 1"  # POSIX sleep may take whole seconds only
    return (
        _tagged_fn(pgid, tag)
        # Once the group has gone, `kill -0` (a builtin) says so without the processes `tagged` runs: a stop
        # of many nodes costs their hosts a third less (bench/cli_scale.py). While any process has the group
        # id, the tag is still checked (the id may have been reused).
        + f"left() {{ kill -0 -{g} 2>/dev/null && tagged; }}\n"
        "tagged || exit 0\n"
        f"kill -TERM -{g} 2>/dev/null\n"
        f"i=0; while [ $i -lt {steps} ] && left; do {nap}; i=$((i + 1)); done\n"
        "for n in 1 2 3; do\n"
        "  left || exit 0\n"
        f"  kill -KILL -{g} 2>/dev/null; {nap}\n"
        "done\n"
        "left && exit 3; exit 0\n"
    )


def tail_script(log_path: str, lines: int) -> str:
    """The last `lines` lines of a log, nothing if it does not exist."""
    return f"tail -n {int(lines)} -- {shlex.quote(log_path)} 2>/dev/null; exit 0\n"


def follow_script(log_path: str, lines: int, pid: int | None) -> str:
    """Follow a log until the process `pid` ends (GNU tail --pid, which checks it every half second)."""
    until = f" -s 0.5 --pid={int(pid)}" if pid else ""
    return f"exec tail -n {int(lines)} -F{until} -- {shlex.quote(log_path)} 2>/dev/null\n"


def check_tag(tag: str) -> str:
    """Tags are names we generate; refuse anything else rather than quote it into environ matching."""
    if not _TAG_RE.fullmatch(tag):
        raise ValueError(f"invalid process tag {tag!r}")
    return tag


class ShellExecutor(ABC):
    """Implements start/alive/signal/logs on top of two primitives: run a shell string, stream one."""

    host: str
    control_timeout_s: float = CONTROL_TIMEOUT_S

    @abstractmethod
    def connect(self) -> None:
        """Open the connection."""

    @abstractmethod
    def _run(self, command: str, timeout_s: float, on_line: LineSink | None) -> CommandResult:
        """Run a shell string; CommandTimeout past `timeout_s`."""

    @abstractmethod
    def _stream(self, command: str, stop: threading.Event | None) -> Iterator[str]:
        """Lines of a long-running command's stdout until it ends or `stop` is set."""

    @abstractmethod
    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a file to the host."""

    @abstractmethod
    def get(self, remote_path: str, local_path: str) -> None:
        """Copy a file of the host here."""

    @abstractmethod
    def forward(self, remote_host: str, remote_port: int) -> Forward | None:
        """A local endpoint for a port as the node reaches it."""

    @abstractmethod
    def close(self) -> None:
        """Release resources."""

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0, *,
            env: Mapping[str, str] | None = None, on_line: LineSink | None = None) -> CommandResult:
        """Run a shell string or argv, with `env` set for it alone."""
        return self._run(with_env(as_shell(command), env), timeout_s, on_line)

    def start(self, command: str, log_path: str, workdir: str = "/", tag: str = "") -> ProcessHandle:
        """Start `command` detached; the handle names its PID (= process group) and start time."""
        tag = check_tag(tag or "k3deploy")
        res = self.run(sh(start_script(command, log_path, workdir, tag)), timeout_s=self.control_timeout_s)
        return started_handle(self.host, res, log_path, workdir, tag)

    def alive(self, handle: ProcessHandle) -> bool:
        """The group leader runs and is the process we started."""
        if handle.pid is None:
            return False
        return self.run(sh(alive_script(handle.pid, handle.start_ticks)), self.control_timeout_s).exit_code == 0

    def signal(self, handle: ProcessHandle, sig: int) -> bool:
        """Signal the whole process group (guarded by the tag); False when nothing of it is left."""
        if handle.pid is None:
            return False
        script = signal_script(handle.pid, check_tag(handle.tag), sig)
        return self.run(sh(script), self.control_timeout_s).exit_code == 0

    def terminate(self, handle: ProcessHandle, grace_s: float) -> bool:
        """SIGTERM the group, SIGKILL what is left after `grace_s`, all in one command on the node."""
        if handle.pid is None:
            return True
        script = terminate_script(handle.pid, check_tag(handle.tag), grace_s)
        return self.run(sh(script), grace_s + self.control_timeout_s).exit_code == 0

    def read_log(self, handle: ProcessHandle, tail_lines: int = 50) -> str:
        """The last lines of the log."""
        return self.run(sh(tail_script(handle.log_path, tail_lines)), self.control_timeout_s).stdout

    def follow(
        self, handle: ProcessHandle, tail_lines: int = 10, stop: threading.Event | None = None
    ) -> Iterator[str]:
        """Stream the log until the process ends or `stop` is set."""
        return self._stream(sh(follow_script(handle.log_path, tail_lines, handle.pid)), stop)


def split_lines(read_chunk: Callable[[], bytes | None], stop: threading.Event | None) -> Iterator[str]:
    """Lines from `read_chunk` (None: nothing yet, b"": the end) until the end or `stop` is set; a last
    line without a newline is kept."""
    buf = b""
    for _ in range(10**9):  # bounded by the end of the stream or `stop`
        if stop is not None and stop.is_set():
            return
        chunk = read_chunk()
        if chunk is None:
            continue
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")
    if buf:
        yield buf.decode(errors="replace")


def with_env(command: str, env: Mapping[str, str] | None) -> str:
    """`command` run with extra environment variables (`env NAME=VALUE... sh -c COMMAND`, all quoted)."""
    if not env:
        return command
    bad = [k for k in env if not _ENV_NAME_RE.fullmatch(k)]
    if bad:
        raise ValueError(f"invalid environment variable name(s): {bad}")
    pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    return f"env {pairs} sh -c {shlex.quote(command)}"


class LineSplitter:
    """Feeds complete lines of a byte stream to a sink as chunks arrive; `flush` hands over the rest."""

    def __init__(self, sink: LineSink | None) -> None:
        self.sink = sink
        self._buf = b""

    def feed(self, chunk: bytes) -> None:
        """Add a chunk; complete lines go to the sink."""
        if self.sink is None or not chunk:
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self.sink(line.decode(errors="replace"))

    def flush(self) -> None:
        """A last line without a newline."""
        if self.sink is not None and self._buf:
            self.sink(self._buf.decode(errors="replace"))
        self._buf = b""


def as_shell(command: str | Sequence[str]) -> str:
    """A shell string as is; an argv quoted piece by piece."""
    return command if isinstance(command, str) else shlex.join(command)
