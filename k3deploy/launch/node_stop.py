"""Stopping one node of a group: its process group, its container, its IPC sockets, the end of its log."""
from __future__ import annotations

import shlex
from collections.abc import Callable

from k3deploy.errors import ExecError
from k3deploy.executors.base import Executor, ProcessHandle
from k3deploy.launch.ipc import remove_ipc_dir
from k3deploy.nodeplan.jobs import NodeJob


def terminate(ex: Executor, handle: ProcessHandle, grace_s: float, container: str | None) -> bool:
    """The node's process group stopped (SIGTERM, up to grace_s, SIGKILL), its container removed and, once
    nothing of it is left, its IPC directory: every way a started node is stopped goes through here. True
    when it is gone; ExecError when the node cannot be reached."""
    gone = ex.terminate(handle, grace_s)
    if container:
        ex.run(shlex.join(["docker", "rm", "-f", container]), timeout_s=60)
    if gone:  # the sockets of processes that survived stay with them
        try:
            ex.run(remove_ipc_dir(handle.tag), timeout_s=60)
        except ExecError:
            pass  # stopped all the same; a later launch uses a new directory
    return gone


def stop_node(job: NodeJob, handle: ProcessHandle, ex: Executor, grace_s: float, log_lines: int,
              event: Callable[[NodeJob, str, str], None]) -> tuple[str, str | None]:
    """SIGTERM, up to grace_s, SIGKILL (all on the node), each phase reported: (outcome, the log's last
    `log_lines` lines read right after, or None)."""
    try:
        gone = terminate(ex, handle, grace_s, job.container)
    except ExecError as exc:
        what = f"unreachable: {exc}"
        event(job, "failed", what)
        return what, None
    what = "stopped" if gone else "processes survived SIGKILL"
    event(job, "stopped", "") if gone else event(job, "failed", what)
    log = None
    if log_lines:
        try:
            log = ex.read_log(handle, log_lines)
        except ExecError:
            pass  # the outcome stands; `logs` says the copy is missing
    return what, log
