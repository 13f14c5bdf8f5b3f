"""Is rank 0 serving, and does any node's log already say it cannot succeed?"""
from __future__ import annotations

import urllib.error
import urllib.request

# Lines after which an engine can hang until a distributed timeout instead of exiting (the anchors:
# Gloo on a wrong interface, a broken mesh, memory exhaustion): seeing one fails the launch at once.
FATAL_PATTERNS: tuple[str, ...] = (
    "Unable to find address for",
    "connectFullMesh failed",
    "out of memory",
    "OutOfMemoryError",
    "DistNetworkError",
    "DistStoreError",
)


def fatal_line(log_text: str) -> str | None:
    """The first log line matching a known fatal pattern (case-insensitive), if any."""
    lowered = [p.lower() for p in FATAL_PATTERNS]
    for line in log_text.splitlines():
        low = line.lower()
        if any(p in low for p in lowered):
            return line.strip()
    return None


# Rendered URLs point at the nodes' private IPs: never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_ok(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(True, '') on a 2xx answer, else (False, why) - never raises."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return 200 <= resp.status < 300, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, str(reason)


def serving(url: str, paths: tuple[str, ...], timeout_s: float = 2.0) -> tuple[bool, str]:
    """Every readiness path answers 2xx, checked in order (health before /v1/models)."""
    for path in paths or ("/health",):
        ok, why = http_ok(url.rstrip("/") + path, timeout_s)
        if not ok:
            return False, f"{path}: {why}"
    return True, ""
