"""Is rank 0 serving, and does any node's log already say it cannot succeed?"""
from __future__ import annotations

import functools
import re
import shlex
import socket
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from k3deploy.errors import ExecError, LaunchError
from k3deploy.executors.base import Executor
from k3deploy.executors.posix import sh
from k3deploy.launch import http_probe
from k3deploy.launch.http_probe import serving

__all__ = ["FATAL_PATTERNS", "ProbeFrom", "choose_probe_from", "fatal_line", "probe_script", "reachable_from_here",
           "serving", "serving_through"]

# Where rank 0's HTTP readiness is checked from: this machine, or rank 0 itself (through its executor).
ProbeFrom = Literal["here", "head"]
NO_PROBE_TOOL = 3

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


def fatal_line(log_text: str) -> str | None:
    """The first log line matching a known fatal error text, if any."""
    for line in log_text.splitlines():
        if _FATAL_RE.search(line):
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


@functools.cache
def _probe_source() -> str:
    """http_probe's own source, read once: it is sent to rank 0 on every readiness poll."""
    return Path(http_probe.__file__).read_text(encoding="utf-8")


def probe_script(url: str, paths: Sequence[str], timeout_s: float) -> str:
    """A POSIX sh script that checks readiness on the node itself: http_probe under python3, else curl."""
    q = shlex.quote
    python = shlex.join(["python3", "-c", _probe_source(), url, f"{timeout_s:g}", *paths])
    curl_paths = " ".join(q(p) for p in paths or ("/health",))
    return (
        f"if command -v python3 >/dev/null 2>&1; then exec {python}; fi\n"
        "if command -v curl >/dev/null 2>&1; then\n"
        f"  for p in {curl_paths}; do\n"
        f"    code=$(curl -s -o /dev/null -w '%{{http_code}}' --noproxy '*' -m {timeout_s:g} {q(url.rstrip('/'))}\"$p\")\n"
        '    case "$code" in 2??) ;; 000) echo "$p: no answer"; exit 1 ;; *) echo "$p: HTTP $code"; exit 1 ;; esac\n'
        "  done\n"
        "  exit 0\n"
        "fi\n"
        f"exit {NO_PROBE_TOOL}\n"
    )


def serving_through(executor: Executor, url: str, paths: Sequence[str], timeout_s: float = 2.0) -> tuple[bool, str]:
    """`serving`, checked on the node behind `executor` (for a rank 0 this machine cannot reach)."""
    try:
        res = executor.run(sh(probe_script(url, paths, timeout_s)), timeout_s=timeout_s * max(1, len(paths)) + 10)
    except ExecError as exc:
        return False, f"probe through {executor.host}: {exc}"
    if res.exit_code == NO_PROBE_TOOL:
        raise LaunchError(f"{executor.host}: cannot check readiness on rank 0: neither python3 nor curl is there",
                          hint="install curl on rank 0, or make its ip reachable from here and set "
                               "launch.readiness_probe: here")
    if res.exit_code == 0:
        return True, ""
    return False, (res.stdout.strip() or res.stderr.strip() or f"probe exit {res.exit_code}")
