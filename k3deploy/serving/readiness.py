"""Is rank 0 serving, and does any node's log already say it cannot succeed?"""
from __future__ import annotations

import re
import socket
import urllib.parse
from typing import Literal

from k3deploy.engines.failures import STACK_FRAME_RE, first_fatal, root_cause

# Where rank 0's HTTP readiness is checked from: this machine, or as rank 0 itself sees it (through its executor).
ProbeFrom = Literal["here", "head"]
KNOWN_CAUSE = "; cause: "  # before the failure catalog's cause and fix of a node's log

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
    return next((line for line in lines if _EXCEPTION_RE.search(line) and not STACK_FRAME_RE.match(line)), None)


def fatal_line(log_text: str) -> str | None:
    """The first log line naming a failure an engine can hang after instead of exiting (the catalog's fatal
    signatures: Gloo on a wrong interface, a broken mesh, memory exhaustion, a store timeout), if any."""
    found = first_fatal(log_text)
    return found.line.strip() if found else None


def known_cause(log_text: str, rank: int, host: str, ip: str = "", iface: str = "") -> str:
    """`; cause: ... Fix: ...` for the catalog's signature that explains a node's log, or nothing."""
    found = root_cause(log_text, {"host": host, "ip": ip, "iface": iface, "rank": str(rank)})
    return f"{KNOWN_CAUSE}{found.summary()}" if found else ""


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
