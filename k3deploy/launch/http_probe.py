"""Does a URL answer 2xx on every readiness path? Standard library only, no k3deploy imports: the same
source runs here, and (as `python3 -c`) on rank 0 when this machine cannot reach rank 0's private IP.

Exit status as a script: 0 serving, 1 not (the reason on stdout), 2 bad arguments.
"""
import sys
import urllib.error
import urllib.request

# Rendered URLs point at the nodes' private IPs: never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_ok(url: str, timeout_s: float = 2.0) -> "tuple[bool, str]":
    """(True, '') on a 2xx answer, else (False, why) - never raises."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return 200 <= resp.status < 300, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc))


def serving(url: str, paths: "tuple[str, ...]", timeout_s: float = 2.0) -> "tuple[bool, str]":
    """Every readiness path answers 2xx, checked in order (health before /v1/models)."""
    for path in paths or ("/health",):
        ok, why = http_ok(url.rstrip("/") + path, timeout_s)
        if not ok:
            return False, f"{path}: {why}"
    return True, ""


def main(argv: "list[str]") -> int:
    """URL TIMEOUT_S [PATH...]: print why not and exit 1 unless every path answers 2xx."""
    if len(argv) < 2:
        print("usage: URL TIMEOUT_S [PATH...]")
        return 2
    ok, why = serving(argv[0], tuple(argv[2:]), float(argv[1]))
    if not ok:
        print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
