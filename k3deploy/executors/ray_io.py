"""Data through the Ray agent of one node: following a log in chunks, copying files both ways in chunks."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import ray
from ray.exceptions import RayError

from k3deploy.errors import ExecError
from k3deploy.executors import ray_agent
from k3deploy.executors.base import ProcessHandle
from k3deploy.executors.posix import follow_script


class RayNode(Protocol):
    """What these transfers need of the Ray executor (a protocol, so this module does not import it)."""

    host: str
    control_timeout_s: float

    def connect(self) -> None: ...
    def agent_of(self, handle: ProcessHandle) -> Any: ...
    def call(self, ref: Any, timeout_s: float, what: str) -> Any: ...
    def pin(self) -> Any: ...
    def read_log(self, handle: ProcessHandle, tail_lines: int = 50) -> str: ...

READ_WAIT_S = 0.5
_write_chunk = ray.remote(num_cpus=0, max_retries=0)(ray_agent.write_chunk)
_read_chunk = ray.remote(num_cpus=0, max_retries=0)(ray_agent.read_chunk)
# Under Ray's inline limit for task arguments and results (max_direct_call_object_size, 100 KiB).
CHUNK_BYTES = 64 * 1024


class AgentGone(Exception):
    """The actor of a handle did not answer: fall back to a pinned task. `dead`: Ray says it died (it is
    forgotten); otherwise it is unavailable for the moment (an RPC that failed under load) and is asked
    again next time, and killed by name once its process group is gone."""

    def __init__(self, dead: bool = True) -> None:
        super().__init__("the Ray agent died" if dead else "the Ray agent is unavailable for the moment")
        self.dead = dead


def follow(ex: RayNode, handle: ProcessHandle, tail_lines: int, stop: threading.Event | None) -> Iterator[str]:
    """Stream the log (in chunks through the agent) until the process ends or `stop` is set."""
    ex.connect()
    agent = ex.agent_of(handle)
    script = follow_script(handle.log_path, tail_lines, handle.pid)
    if agent is None:  # the process went with its agent: what it wrote is all there is
        yield from ex.read_log(handle, tail_lines).splitlines()
        return
    try:
        sid = ex.call(agent.stream_open.remote(script), ex.control_timeout_s, "follow the log")
    except AgentGone:
        yield from ex.read_log(handle, tail_lines).splitlines()
        return
    buf = b""
    try:
        for _ in range(10**9):  # ends when the process ends, the agent dies or `stop` is set
            if stop is not None and stop.is_set():
                return
            try:
                chunk, ended = ex.call(agent.stream_read.remote(sid, READ_WAIT_S),
                                       READ_WAIT_S + ex.control_timeout_s, "read the log")
            except AgentGone:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace")
            if ended:
                break
        if buf:
            yield buf.decode(errors="replace")
    finally:
        try:
            agent.stream_close.remote(sid)
        except RayError:
            pass


def put(ex: RayNode, local_path: str, remote_path: str) -> None:
    """Copy a local file to the node in chunks small enough to travel inside the task call (larger
    arguments go through the object store, whose transfers between nodes cannot be bounded here)."""
    ex.connect()
    try:
        data = Path(local_path).read_bytes()
    except OSError as exc:
        raise ExecError(f"copy {local_path} -> {remote_path}: {exc}", host=ex.host) from exc
    what = f"copy {local_path} -> {remote_path}"
    starts = range(0, max(1, len(data)), CHUNK_BYTES)
    for start in starts:
        ref = _write_chunk.options(scheduling_strategy=ex.pin()).remote(
            remote_path, start, data[start:start + CHUNK_BYTES], start == starts[-1])
        ex.call(ref, ex.control_timeout_s, what)


def get(ex: RayNode, remote_path: str, local_path: str) -> None:
    """Copy a file of the node here, in chunks (as `put`)."""
    ex.connect()
    what = f"copy {remote_path} -> {local_path}"
    pin = ex.pin()
    first, size = ex.call(_read_chunk.options(scheduling_strategy=pin).remote(remote_path, 0, CHUNK_BYTES),
                          ex.control_timeout_s, what)
    refs = [_read_chunk.options(scheduling_strategy=pin).remote(remote_path, start, CHUNK_BYTES)
            for start in range(CHUNK_BYTES, size, CHUNK_BYTES)]
    rest = ex.call(refs, ex.control_timeout_s + len(refs) * 0.1, what) if refs else []
    try:
        Path(local_path).write_bytes(first + b"".join(chunk for chunk, _ in rest))
    except OSError as exc:
        raise ExecError(f"{what}: {exc}", host=ex.host) from exc
