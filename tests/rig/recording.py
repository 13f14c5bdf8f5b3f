"""A recording executor (Ray's MockProcessRunner is the model): no process is started. It records every call it
is asked to make, in order, and plays each started node from a script (when the engine prints which lines,
when rank 0 answers HTTP, when it exits and with what status, whether it ignores SIGTERM). Sequencing tests
(gang order, stop-all on the first failure, readiness deadlines, fail-fast on a fatal line) assert on the
calls; tests/unit/test_executor_contract_recording.py holds it to the executor contract the real executors
pass, which keeps the fake honest.

Logs are real files at the handle's log_path (the wrapper's exit line included), so everything that reads
logs reads what a real node would have written; rank 0's HTTP is a thread serving on the node's address.
"""
from __future__ import annotations

import itertools
import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from k3deploy.errors import CommandTimeout, ExecError
from k3deploy.executors.base import EXIT_MARK, CommandResult, LineSink, ProcessHandle
from k3deploy.executors.local import DirectEndpoint
from k3deploy.executors.posix import as_shell, with_env
from k3deploy.executors.target import ExecTarget, LocalTarget

TERM, KILL = 15, 9


@dataclass(frozen=True)
class NodeScript:
    """How one started node behaves, in seconds from its start."""

    lines: tuple[str, ...] = ()  # printed one after another, `line_every_s` apart
    line_every_s: float = 0.0
    exit_after_s: float | None = None  # ends on its own (after its lines) with `exit_status`; None: runs on
    exit_status: int = 0
    ignores_term: bool = False  # SIGTERM does nothing: terminate's SIGKILL after the grace ends it
    serve: tuple[str, int] | None = None  # answers HTTP on (ip, port) ...
    ready_after_s: float | None = 0.0  # ... with 200 from this moment on (before: 503); None: never
    completion_status: int = 200  # what /v1/completions answers once ready


@dataclass(frozen=True)
class Reply:
    """A scripted answer to `run`: what the command printed and its status; `takes_s` past the call's
    timeout raises CommandTimeout as a real executor would."""

    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    takes_s: float = 0.0


@dataclass(frozen=True)
class Call:
    """One thing an executor was asked to do."""

    host: str
    op: str  # connect, run, start, alive, signal, terminate, read_log, follow, put, get, forward, close
    detail: str  # run/start: the command; signal: the number; start..: the handle's tag
    at: float = field(default_factory=time.monotonic)


@dataclass
class _Proc:
    handle: ProcessHandle
    script: NodeScript
    t0: float
    written: int = 0
    status: int | None = None  # set when it ended
    ended_at: float = 0.0
    term_at: float | None = None
    server: ThreadingHTTPServer | None = None


class Nodes:
    """The scripted nodes every RecordingExecutor of one test shares, and the calls made to them."""

    def __init__(self, scripts: Mapping[int, NodeScript] | Callable[[str, str], NodeScript] | None = None,
                 replies: Sequence[tuple[str, Reply]] = ()) -> None:
        """`scripts`: rank (the tag's middle field, `deployment.rank.run`) -> script, or a function of
        (command, tag); `replies`: (regex searched in the command, reply) for `run`, first match wins;
        an unmatched command succeeds with no output."""
        self._scripts = scripts or {}
        self.replies = list(replies)
        self.calls: list[Call] = []
        self.procs: list[_Proc] = []
        self._lock = threading.RLock()
        self._pids = itertools.count(40000)

    def factory(self, target: ExecTarget) -> RecordingExecutor:
        """An ExecutorFactory: one recording executor per node, all playing these scripts."""
        return RecordingExecutor(target.host, self)

    def record(self, host: str, op: str, detail: str = "") -> None:
        with self._lock:
            self.calls.append(Call(host, op, detail))

    def ops(self, *ops: str) -> list[tuple[str, str]]:
        """(op, detail) of the recorded calls of those kinds, in the order they were made."""
        return [(c.op, c.detail) for c in self.calls if c.op in ops]

    def script_for(self, command: str, tag: str) -> NodeScript:
        if callable(self._scripts):
            return self._scripts(command, tag)
        parts = tag.split(".")
        rank = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else 0
        return self._scripts.get(rank, NodeScript())

    def running(self) -> list[ProcessHandle]:
        """Handles of every scripted process that has not ended (a test's "left nothing behind")."""
        with self._lock:
            for p in self.procs:
                self.advance(p)
            return [p.handle for p in self.procs if p.status is None]

    def find(self, handle: ProcessHandle) -> _Proc | None:
        """The process a handle means: same PID, start time and tag (a stale or foreign handle is none)."""
        return next((p for p in self.procs if p.handle.pid == handle.pid and p.handle.tag == handle.tag
                     and p.handle.start_ticks == handle.start_ticks), None)

    def advance(self, p: _Proc) -> None:
        """Bring a process up to now: the lines that are due written to its log, its own exit, a SIGTERM."""
        with self._lock:
            if p.status is not None:
                return
            now = time.monotonic()
            s = p.script
            due = len(s.lines) if s.line_every_s <= 0 else min(len(s.lines), int((now - p.t0) / s.line_every_s) + 1)
            if due > p.written:
                self._append(p, s.lines[p.written:due])
                p.written = due
            lines_s = s.line_every_s * max(0, len(s.lines) - 1)
            if s.exit_after_s is not None and now - p.t0 >= max(s.exit_after_s, lines_s):
                self.end(p, s.exit_status)
            elif p.term_at is not None and not s.ignores_term:
                self.end(p, 128 + TERM)

    def end(self, p: _Proc, status: int) -> None:
        with self._lock:
            if p.status is not None:
                return
            p.status, p.ended_at = status, time.time()
            self._append(p, (f"{EXIT_MARK} {status} at {p.ended_at:.3f}",))
            if p.server is not None:
                p.server.shutdown()
                p.server.server_close()

    @staticmethod
    def _append(p: _Proc, lines: Sequence[str]) -> None:
        with open(p.handle.log_path, "a") as f:
            f.writelines(line + "\n" for line in lines)

    def kill(self, rank: int) -> ProcessHandle:
        """SIGKILL the running process of one rank, as the OOM killer would (its wrapper writes status 137)."""
        p = next(p for p in reversed(self.procs) if p.status is None and p.handle.tag.split(".")[-2] == str(rank))
        self.end(p, 128 + KILL)
        return p.handle

    def close(self) -> None:
        """SIGKILL what still runs (its HTTP server closes with it)."""
        for h in self.running():
            p = self.find(h)
            if p is not None:
                self.end(p, 128 + KILL)


class RecordingExecutor:
    """The Executor interface over scripted nodes: every call recorded in `nodes.calls`."""

    capabilities = LocalTarget.capabilities  # streams logs, forwards ports, the node is this machine

    def __init__(self, host: str, nodes: Nodes) -> None:
        self.host = host
        self.nodes = nodes

    def connect(self) -> None:
        """Nothing to open; recorded."""
        self.nodes.record(self.host, "connect")

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0, *,
            env: Mapping[str, str] | None = None, on_line: LineSink | None = None) -> CommandResult:
        """The first scripted reply whose pattern the command matches (env and argv quoted as the real
        executors do, so patterns see what a node's shell would)."""
        text = with_env(as_shell(command), env)
        self.nodes.record(self.host, "run", text)
        reply = next((r for pattern, r in self.nodes.replies if re.search(pattern, text)), Reply())
        if reply.takes_s > timeout_s:
            time.sleep(timeout_s)
            raise CommandTimeout(f"command timed out after {timeout_s:g} s", host=self.host)
        if on_line is not None:
            for line in reply.stdout.splitlines():
                on_line(line)
        return CommandResult(exit_code=reply.exit_code, stdout=reply.stdout, stderr=reply.stderr)

    def start(self, command: str, log_path: str, workdir: str = "/", tag: str = "") -> ProcessHandle:
        """A scripted process, its log at `log_path` (its directory made as the real start script does)."""
        self.nodes.record(self.host, "start", command)
        try:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            Path(log_path).touch()
        except OSError as exc:
            raise ExecError(f"cannot create the log directory of {log_path}: {exc}", host=self.host) from exc
        script = self.nodes.script_for(command, tag)
        pid = next(self.nodes._pids)
        handle = ProcessHandle(host=self.host, pid=pid, start_ticks=pid * 7, tag=tag, log_path=log_path)
        proc = _Proc(handle, script, time.monotonic())
        if script.serve is not None:
            proc.server = _serve(proc)
        with self.nodes._lock:
            self.nodes.procs.append(proc)
        self.nodes.advance(proc)
        return handle

    def _live(self, handle: ProcessHandle) -> _Proc | None:
        p = self.nodes.find(handle)
        if p is not None:
            self.nodes.advance(p)
        return p if p is not None and p.status is None else None

    def alive(self, handle: ProcessHandle) -> bool:
        """The scripted process has not ended."""
        self.nodes.record(self.host, "alive", handle.tag)
        return self._live(handle) is not None

    def signal(self, handle: ProcessHandle, sig: int) -> bool:
        """0 probes; SIGTERM ends it unless it ignores SIGTERM; SIGKILL ends it."""
        self.nodes.record(self.host, "signal", str(sig))
        p = self._live(handle)
        if p is None:
            return False
        if sig == KILL:
            self.nodes.end(p, 128 + KILL)
        elif sig == TERM:
            p.term_at = time.monotonic()
            self.nodes.advance(p)
        return True

    def terminate(self, handle: ProcessHandle, grace_s: float) -> bool:
        """SIGTERM, then SIGKILL when it ignores SIGTERM (the grace is not waited out: no process to wait for)."""
        self.nodes.record(self.host, "terminate", handle.tag)
        p = self._live(handle)
        if p is not None:
            p.term_at = time.monotonic()
            self.nodes.advance(p)
            self.nodes.end(p, 128 + KILL)  # no-op when SIGTERM ended it
        return True

    def read_log(self, handle: ProcessHandle, tail_lines: int = 50) -> str:
        """The last lines of the log file."""
        self.nodes.record(self.host, "read_log", handle.tag)
        self._live(handle)
        return _tail(handle.log_path, tail_lines)

    def follow(self, handle: ProcessHandle, tail_lines: int = 10,
               stop: threading.Event | None = None) -> Iterator[str]:
        """Log lines as the script writes them, until the process ends or `stop` is set."""
        self.nodes.record(self.host, "follow", handle.tag)
        start = _tail(handle.log_path, tail_lines).splitlines()
        yield from start
        seen = _count_lines(handle.log_path) if start else 0
        while stop is None or not stop.is_set():
            running = self._live(handle) is not None
            with open(handle.log_path) as f:
                new = f.read().splitlines()[seen:]
            seen += len(new)
            yield from new
            if not running:
                return
            time.sleep(0.02)

    def put(self, local_path: str, remote_path: str) -> None:
        """Copy within this machine (the scripted node's files are this machine's)."""
        self.nodes.record(self.host, "put", remote_path)
        _copy(local_path, remote_path, self.host)

    def get(self, remote_path: str, local_path: str) -> None:
        """Copy within this machine."""
        self.nodes.record(self.host, "get", remote_path)
        _copy(remote_path, local_path, self.host)

    def forward(self, remote_host: str, remote_port: int) -> DirectEndpoint:
        """Rank 0's scripted server listens on this machine: reachable as it is."""
        self.nodes.record(self.host, "forward", f"{remote_host}:{remote_port}")
        return DirectEndpoint(remote_host, remote_port)

    def close(self) -> None:
        """Nothing to release; recorded."""
        self.nodes.record(self.host, "close")


def _serve(p: _Proc) -> ThreadingHTTPServer:
    script = p.script
    assert script.serve is not None

    class Handler(BaseHTTPRequestHandler):
        def _ready(self) -> bool:
            return script.ready_after_s is not None and time.monotonic() - p.t0 >= script.ready_after_s

        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if not self._ready():
                self._send(503, {"error": "loading"})
            else:
                found = self.path in ("/health", "/v1/models")
                self._send(200 if found else 404, {"data": [{"id": "kimi-k3-tiny"}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            code = script.completion_status if self._ready() else 503
            code = code if self.path == "/v1/completions" else 404
            self._send(code, {"choices": [{"text": "x"}]} if code == 200 else {"error": {"message": "EngineCore died"}})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(script.serve, Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name="recorded-node-http").start()
    return server


def _tail(path: str, lines: int) -> str:
    try:
        with open(path) as f:
            text = f.read().splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(text[-lines:]) + ("\n" if text and lines else "") if lines else ""


def _count_lines(path: str) -> int:
    with open(path) as f:
        return len(f.read().splitlines())


def _copy(src: str, dst: str, host: str) -> None:
    try:
        shutil.copyfile(src, dst)
    except OSError as exc:
        raise ExecError(f"copy {src} -> {dst}: {exc}", host=host) from exc


