"""The effort stage's load, run on rank 0 itself when only the node reaches its API (Ray): standard library
only, no k3deploy imports, shipped by source to `python3 -c`.

Arguments: URL TIMEOUT_S CONCURRENCY BODIES_JSON (a list). Each body is POSTed to URL by one of CONCURRENCY
threads. Prints one JSON line per request,
{"i": index, "t": [seconds after its start of each `data:` line], "data": [the payloads], "error": str|null},
then the result line {"type": "result", "duration_s": wall time of the whole run}.
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

# Rendered URLs point at the nodes' private IPs: never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_PRINT = threading.Lock()


def one(i: int, url: str, body: "dict[str, object]", timeout_s: float) -> None:
    """Stream one request and print its line."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    times, data, error = [], [], None
    t0 = time.monotonic()
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            for raw in resp:
                if raw.startswith(b"data:"):
                    times.append(time.monotonic() - t0)
                    data.append(raw[5:].strip().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        error = "HTTP {}: {}".format(exc.code, exc.read()[:200].decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        error = str(getattr(exc, "reason", exc))
    line = json.dumps({"i": i, "t": times, "data": data, "error": error})
    with _PRINT:
        print(line, flush=True)


def main(argv: "list[str]") -> int:
    """Entry point; exit 2 on bad arguments."""
    if len(argv) != 4:
        print(json.dumps({"type": "result", "error": "usage: URL TIMEOUT_S CONCURRENCY BODIES_JSON"}))
        return 2
    url, timeout_s, concurrency, bodies = argv[0], float(argv[1]), int(argv[2]), json.loads(argv[3])
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(concurrency, 1)) as pool:
        for i, body in enumerate(bodies):
            pool.submit(one, i, url, body, timeout_s)
    print(json.dumps({"type": "result", "duration_s": time.monotonic() - t0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
