"""NodeAgent: the Ray actor k3deploy pins to one node; a small shell for the process it starts there.

Standard library only: the Ray executor ships this module to the nodes by value, so a cluster needs Ray
but not k3deploy installed. The agent runs the same `sh -c` scripts as the SSH executor (start, alive,
signal, tail), plus log streams the driver polls in chunks.
"""
from __future__ import annotations

import itertools
import os
import select
import signal
import socket
import subprocess
import threading
import time

# A log stream nobody has read for this long belongs to a driver that went away.
STREAM_IDLE_S = 60.0
STREAM_CHUNK_BYTES = 256 * 1024


class NodeAgent:
    """One per started process (a threaded actor: control calls and log reads run concurrently)."""

    def __init__(self) -> None:
        self._env = node_env()
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def ready(self) -> dict[str, object]:
        """Where the agent runs: PID and start time (the engine's watchdog polls them), host, Ray node."""
        import ray  # only ever called inside a Ray worker

        pid = os.getpid()
        return {"pid": pid, "start_ticks": _start_ticks(pid), "hostname": socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def run(self, script: str, timeout_s: float) -> tuple[int | None, str, str]:
        """Run a shell script with the node's environment; (exit code or None on timeout, stdout, stderr)."""
        return run_shell(script, timeout_s, self._env)

    def stream_open(self, script: str) -> int:
        """Start a long-running script (a log follower); returns the id to read it by."""
        self._reap_idle()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=self._env, cwd="/", start_new_session=True,
        )  # fmt: skip
        with self._lock:
            sid = next(self._ids)
            self._streams[sid] = _Stream(proc)
        return sid

    def stream_read(self, sid: int, wait_s: float) -> tuple[bytes, bool]:
        """Output available within `wait_s` (may be empty) and whether the script has ended."""
        with self._lock:
            stream = self._streams.get(sid)
        if stream is None:
            return b"", True
        data, ended = stream.read(wait_s)
        if ended:
            self.stream_close(sid)
        return data, ended

    def stream_close(self, sid: int) -> None:
        """Stop a stream (idempotent)."""
        with self._lock:
            stream = self._streams.pop(sid, None)
        if stream is not None:
            _kill_group(stream.proc)
            stream.proc.wait()
            if stream.proc.stdout is not None:
                stream.proc.stdout.close()

    def _reap_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [sid for sid, s in self._streams.items() if now - s.last_read > STREAM_IDLE_S]
        for sid in idle:
            self.stream_close(sid)


class _Stream:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.last_read = time.monotonic()

    def read(self, wait_s: float) -> tuple[bytes, bool]:
        self.last_read = time.monotonic()
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], max(0.0, wait_s))
        data = b""
        while ready and len(data) < STREAM_CHUNK_BYTES:
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                return data, True
            data += chunk
            ready, _, _ = select.select([out], [], [], 0)
        return data, False


def run_shell(script: str, timeout_s: float, env: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    """Run a shell script in its own session; (exit code, stdout, stderr). A timeout kills the session
    and returns None as the exit code (the driver raises its timeout error)."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=node_env() if env is None else env, cwd="/", start_new_session=True, text=True, errors="replace",
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a detached grandchild holds the pipes: give up on the output
            out, err = "", ""
        return None, out, err
    return proc.returncode, out, err


def read_chunk(path: str, offset: int, size: int) -> tuple[bytes, int]:
    """`size` bytes of `path` from `offset`, and the file's whole size."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size), os.fstat(fh.fileno()).st_size


def write_chunk(path: str, offset: int, data: bytes, last: bool) -> None:
    """Write `data` at `offset` of a temp file beside `path`; the last chunk renames it into place."""
    tmp = f"{path}.k3tmp"
    with open(tmp, "r+b" if offset else "wb") as fh:
        fh.seek(offset)
        fh.write(data)
    if last:
        os.replace(tmp, path)


def node_env() -> dict[str, str]:
    """The environment the node's raylet was started with: what a login on the node would see, without
    the variables Ray sets for its workers (OMP_NUM_THREADS=1 and the like would throttle an engine)."""
    raylet = os.environ.get("RAY_RAYLET_PID", "")
    if raylet.isdigit():
        try:
            with open(f"/proc/{raylet}/environ", "rb") as fh:
                pairs = [item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item]
            env = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
            if "PATH" in env:
                return env
        except OSError:
            pass
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    return env


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            raw = fh.read()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def _kill_group(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
