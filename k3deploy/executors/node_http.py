"""One HTTP request made on a node, for executors that cannot forward a port (Ray). Standard library only,
no k3deploy imports: shipped by source to `python3 -c` on the node.

Arguments: METHOD URL TIMEOUT_S [BODY_JSON|-] [stream]. Prints JSON lines: with `stream`, one
{"t": seconds, "data": "..."} per server-sent-event data line as it arrives, then the result line;
the result line is {"status", "headers", "body_b64", "elapsed_s"} or {"error": "..."}.
"""
import base64
import http.client
import json
import sys
import time
import urllib.error
import urllib.request

# Rendered URLs point at the nodes' private IPs: never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(method: str, url: str, timeout_s: float, body: "str | None", stream: bool) -> "dict[str, object]":
    """Make the request; print events (stream) and return the result dict."""
    data = None if body in (None, "-") else body.encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    t0 = time.monotonic()
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            status, headers = resp.status, dict(resp.headers.items())
            if stream:
                chunks = []
                for raw in resp:
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    chunks.append(raw)
                    if line.startswith("data:"):
                        print(json.dumps({"t": time.monotonic() - t0, "data": line[5:].lstrip()}), flush=True)
                payload = b"".join(chunks)
            else:
                payload = resp.read()
    except urllib.error.HTTPError as exc:
        status, headers, payload = exc.code, dict(exc.headers.items()), exc.read()
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        return {"error": str(getattr(exc, "reason", exc))}
    return {"status": status, "headers": headers, "body_b64": base64.b64encode(payload).decode(),
            "elapsed_s": time.monotonic() - t0}


def main(argv: "list[str]") -> int:
    """Entry point; exit 2 on bad arguments."""
    if len(argv) < 3:
        print(json.dumps({"error": "usage: METHOD URL TIMEOUT_S [BODY_JSON|-] [stream]"}))
        return 2
    body = argv[3] if len(argv) > 3 else None
    stream = len(argv) > 4 and argv[4] == "stream"
    print(json.dumps(request(argv[0], argv[1], float(argv[2]), body, stream)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
