"""Process facts read from /proc: liveness, namespaces, parents; bounded kills."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (this machine's PID 1 reaps lazily)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X", "x")


def start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (tells a PID from its reuse)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def parent_pid(pid: int) -> int | None:
    """The parent PID, or None if the process is gone."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def ns_link(pid: int, kind: str) -> str | None:
    """The namespace identity (e.g. 'pid:[4026532301]') of a process, or None."""
    try:
        return os.readlink(PROC / str(pid) / "ns" / kind)
    except OSError:
        return None


def all_pids() -> list[int]:
    """Every PID visible in this process's /proc."""
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def children(parents: Iterable[int]) -> dict[int, list[int]]:
    """Live direct children of each given process, in one /proc walk (no /proc/PID/task/TID/children here)."""
    wanted = set(parents)
    found: dict[int, list[int]] = {pid: [] for pid in wanted}
    for pid in all_pids():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] not in ("Z", "X", "x") and int(fields[1]) in wanted:
            found[int(fields[1])].append(pid)
    return found


def pid_ns_members(ns: str) -> list[int]:
    """Live processes (root-namespace PIDs) whose PID namespace is `ns`."""
    return [p for p in all_pids() if ns_link(p, "pid") == ns and pid_alive(p)]


def ns_local_pid(pid: int) -> int | None:
    """The PID a process has inside its innermost PID namespace (last NSpid entry)."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


def exe_path(pid: int) -> str | None:
    """The executable of a process, or None if unreadable."""
    try:
        return os.readlink(PROC / str(pid) / "exe")
    except OSError:
        return None


def netns_pids(ns_name: str) -> list[int]:
    """Live processes in a named network namespace (`ip netns pids`; [] if it does not exist)."""
    run = subprocess.run(
        ["ip", "netns", "pids", ns_name], capture_output=True, text=True, timeout=10, check=False
    )
    if run.returncode != 0:
        return []
    return [int(tok) for tok in run.stdout.split() if tok.isdigit() and pid_alive(int(tok))]


def send(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Signal each PID, ignoring those already gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_until_gone(list_live: Callable[[], list[int]], timeout_s: float = 5.0) -> list[int]:
    """SIGKILL whatever `list_live` reports until it reports nothing (their IPC directories removed after);
    returns what still lives."""
    deadline = time.monotonic() + timeout_s
    live = list_live()
    with removing_ipc_dirs(live):
        for _ in range(500):
            if not live or time.monotonic() > deadline:
                break
            send(live)
            time.sleep(0.01)
            live = list_live()
    return live


def ipc_dirs(pids: Iterable[int]) -> set[str]:
    """The IPC directories k3deploy gave these processes (VLLM_RPC_BASE_PATH in their environment)."""
    from k3deploy.launch.ipc import IPC_ENV, IPC_PREFIX

    found = set()
    for pid in pids:
        try:
            env = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            name, _, value = item.decode(errors="replace").partition("=")
            if name == IPC_ENV and value.startswith(IPC_PREFIX):
                found.add(value)
    return found


@contextlib.contextmanager
def removing_ipc_dirs(pids: Iterable[int]) -> Iterator[None]:
    """Around a block that SIGKILLs these processes: their IPC directories are removed after it, as `stop`
    would have removed them with the nodes (rig hosts share this machine's /tmp, so nothing else will)."""
    dirs = ipc_dirs(pids)
    try:
        yield
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
