"""Is rank 0 serving, and does any node's log already say it cannot succeed?"""
from __future__ import annotations

import re
import socket
import urllib.parse
from typing import Literal

# Where rank 0's HTTP readiness is checked from: this machine, or as rank 0 itself sees it (through its executor).
ProbeFrom = Literal["here", "head"]

# Lines after which an engine can hang until a distributed timeout instead of exiting (the anchors:
# Gloo on a wrong interface, a broken mesh, memory exhaustion): seeing one fails the launch at once.
# Exact error texts, not words: vLLM's normal start-up says "If you are running out of memory, consider
# decreasing `gpu_memory_utilization`" at INFO, which a bare "out of memory" would take for a crash.
FATAL_PATTERNS: tuple[str, ...] = (
    r"Unable to find address for",  # Gloo: GLOO_SOCKET_IFNAME names no interface of the node
    r"connectFullMesh failed",  # Gloo: the ranks cannot reach each other
    r"\bOutOfMemoryError\b",  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
    r"\b(?:CUDA|HIP|NPU|XPU) out of memory\b",  # RuntimeError: CUDA out of memory. Tried to allocate ...
    r"\bDistNetworkError\b",
    r"\bDistStoreError\b",
)
_FATAL_RE = re.compile("|".join(f"(?:{p})" for p in FATAL_PATTERNS))
# torch prints a C++ stack with each *retried* store connection warning ("TCP client failed to connect ...
# retrying"): its frames name DistNetworkError while the rendezvous still goes on, so they are not a verdict.
_STACK_FRAME_RE = re.compile(r"^\s*frame #\d+: ")


# Why an engine process ended, in the engine's own words: vLLM's multiproc executor names the worker that died
# (`Worker proc VllmWorker-1 died unexpectedly (exit code: None), shutting down executor.`, then exits 0), else the
# exception line a traceback ends with (`RuntimeError: Remote engine 1 must not use --headless ...`).
_DIED_RE = re.compile(r"\bWorker proc \S+ died unexpectedly\b|\bprocess \S+ died unexpectedly\b", re.IGNORECASE)
_EXCEPTION_RE = re.compile(r"(?:^|[\s\]|)])(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt): \S")


def cause_line(log_text: str) -> str | None:
    """The line of a node's log end that says why its engine ended: a worker's death, else the first exception
    line (the root: vLLM's worker raises, then its engine core and API server re-raise around it)."""
    lines = [line.strip() for line in log_text.splitlines()]
    died = next((line for line in lines if _DIED_RE.search(line)), None)
    if died is not None:
        return died
    return next((line for line in lines if _EXCEPTION_RE.search(line) and not _STACK_FRAME_RE.match(line)), None)


def fatal_line(log_text: str) -> str | None:
    """The first log line matching a known fatal error text, if any (C++ stack frames never count)."""
    for line in log_text.splitlines():
        if _FATAL_RE.search(line) and not _STACK_FRAME_RE.match(line):
            return line.strip()
    return None


def reachable_from_here(url: str, timeout_s: float = 2.0) -> bool:
    """Can this machine open TCP to the URL's host and port? A refusal counts: the host answered."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout_s):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:  # no route (a login node off the private network), or silently dropped
        return False


def choose_probe_from(setting: str, url: str | None) -> ProbeFrom:
    """`here` or `head` for a topology's launch.readiness_probe (`auto` asks the network once)."""
    if setting in ("here", "head"):
        return setting  # type: ignore[return-value]
    return "here" if not url or reachable_from_here(url) else "head"
