"""`k3deploy weights sync` on a node, stdlib only (shipped by source as `python3 -c PROGRAM SPEC_JSON`).

SPEC_JSON's "op":
- "space": {"path"} -> the free bytes (statvfs) where the checkpoint directory is or will be made;
- "serve": {"path", "ip", "idle_s"?} -> serve the directory's files (final names only) over HTTP with byte
  ranges on ip, port chosen by the kernel; prints {"type": "serving", "port": N} first, then serves until
  killed, or until no request has come or been answered for idle_s (default IDLE_S: a sync killed outright
  leaves no server behind for long);
- "fetch": {"path", "name", "size", "sha256", "url" | null} -> the file to a temporary name beside its final
  one (from `url`, resuming a partial temporary file with a Range request; with no url the temporary file is
  already there, put by the executor), its sha256 checked against the manifest's, then renamed: a file at its
  final name is always the manifest's; a full disk drops the partial file and answers "full" with the free
  bytes left; an HTTP error answers its "status". Prints {"type": "progress", "done", "total"} lines, then the
  result.
- "mark": {"path", "name"} -> an empty file of that (dot) name in the checkpoint directory, or in the deepest
  directory above it that exists (nothing is made), where it was left ("at") and the type of the filesystem
  holding it (from /proc/mounts): nodes that see it share this storage;
- "marks": {"path", "prefix"} -> the names there that start with `prefix` (the marks this node sees);
- "unmark": {"at", "name"} -> the mark removed.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import http.server
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

READ_BUFFER = 8 << 20
PART_SUFFIX = ".k3part"
IDLE_S = 900.0  # a server with no request for this long exits (its sync is gone)


def temp_name(root: str, name: str) -> str:
    """The temporary file beside `name`'s final path (a dot file: listings and the server skip it)."""
    head, base = os.path.split(os.path.join(root, name))
    return os.path.join(head, f".{base}{PART_SUFFIX}")


def inside(root: str, name: str) -> bool:
    """Whether `name` stays inside `root` once joined and normalised."""
    real = os.path.realpath(root)
    return os.path.realpath(os.path.join(real, name)).startswith(real + os.sep)


def space(spec: dict[str, Any]) -> dict[str, Any]:
    """Free bytes at the checkpoint path, or at its nearest existing parent."""
    at = os.path.abspath(spec["path"])
    while not os.path.isdir(at) and at != os.path.dirname(at):
        at = os.path.dirname(at)
    st = os.statvfs(at)
    return {"type": "result", "free": st.f_bavail * st.f_frsize, "at": at}


class _Handler(http.server.BaseHTTPRequestHandler):
    root = "/"
    busy = 0  # requests being answered
    last = 0.0  # when the last one started or ended (monotonic)
    lock = threading.Lock()

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        with _Handler.lock:
            _Handler.busy += 1
            _Handler.last = time.monotonic()
        try:
            self._answer()
        finally:
            with _Handler.lock:
                _Handler.busy -= 1
                _Handler.last = time.monotonic()

    def _answer(self) -> None:
        name = urllib.request.url2pathname(self.path.lstrip("/"))
        path = os.path.join(self.root, name)
        if not inside(self.root, name) or os.path.basename(path).startswith(".") or not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].rstrip("-").isdigit():
            start = min(int(rng[6:].rstrip("-")), size)
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        with open(path, "rb") as f:
            f.seek(start)
            for _ in range(1 << 40):
                chunk = f.read(READ_BUFFER)
                if not chunk:
                    break
                self.wfile.write(chunk)


def serve(spec: dict[str, Any]) -> None:
    """Serve the checkpoint directory until killed."""
    os.makedirs(spec["path"], exist_ok=True)
    _Handler.root = os.path.realpath(spec["path"])
    server = http.server.ThreadingHTTPServer((spec["ip"], 0), _Handler)
    _Handler.last = time.monotonic()
    idle_s = float(spec.get("idle_s", IDLE_S))

    def watch() -> None:  # a sync killed outright (SIGKILL) cannot stop its servers: each ends once idle
        while True:
            time.sleep(min(idle_s, 5.0))
            with _Handler.lock:
                if not _Handler.busy and time.monotonic() - _Handler.last > idle_s:
                    os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    print(json.dumps({"type": "serving", "port": server.server_address[1]}), flush=True)
    server.serve_forever()


def _progress(done: int, total: int, last: list[float]) -> None:
    now = time.monotonic()
    if now - last[0] >= 1.0:
        last[0] = now
        print(json.dumps({"type": "progress", "done": done, "total": total}), flush=True)


def fetch(spec: dict[str, Any]) -> dict[str, Any]:
    """Download (or take the put) temporary file, check its sha256, rename it to its final name."""
    root, name, size, want = spec["path"], spec["name"], int(spec["size"]), spec["sha256"]
    if not inside(root, name):
        return {"type": "result", "ok": False, "error": f"{name} leaves {root}"}
    tmp, final = temp_name(root, name), os.path.join(root, name)
    h, done, last = hashlib.sha256(), 0, [time.monotonic()]
    try:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if spec.get("url") and os.path.exists(tmp) and os.path.getsize(tmp) > size:
            os.unlink(tmp)
        if os.path.exists(tmp):  # a put file, or a partial download to resume: hash what is there
            with open(tmp, "rb") as f:
                for chunk in iter(lambda: f.read(READ_BUFFER), b""):
                    h.update(chunk)
                    done += len(chunk)
        resumed = done
        if spec.get("url") and done < size:
            req = urllib.request.Request(spec["url"], headers={"Range": f"bytes={done}-"} if done else {})
            with urllib.request.urlopen(req, timeout=60) as resp, open(tmp, "ab" if done else "wb") as out:
                if done and resp.status != 206:
                    return {"type": "result", "ok": False, "error": f"{spec['url']}: no range support"}
                for chunk in iter(lambda: resp.read(READ_BUFFER), b""):
                    out.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    _progress(done, size, last)
                out.flush()
                os.fsync(out.fileno())
    except http.client.HTTPException as exc:  # the server went away mid-file: the partial file is kept to resume
        return {"type": "result", "ok": False, "error": f"{name}: {spec.get('url')}: {exc!r} after {done:,} of "
                f"{size:,} bytes"}
    except urllib.error.HTTPError as exc:  # the source answered, but not with the file (the hub: 404 and why)
        why = exc.headers.get("X-Error-Code") or exc.reason
        return {"type": "result", "ok": False, "status": exc.code, "error": f"{name}: {spec['url']}: HTTP "
                f"{exc.code} {why}"}
    except OSError as exc:  # a full disk, a source gone: no file at the final name, the partial one dropped
        if getattr(exc, "errno", None) == errno.ENOSPC:
            if os.path.exists(tmp):
                os.unlink(tmp)
            return {"type": "result", "ok": False, "full": True, "free": space({"path": root})["free"],
                    "error": f"{name}: {exc}"}
        return {"type": "result", "ok": False, "error": f"{name}: {exc}"}
    got = h.hexdigest()
    if done < size:  # the stream ended early (the server stopped): not corrupt, the partial file is kept to resume
        return {"type": "result", "ok": False, "error": f"{name}: the transfer ended after {done:,} of {size:,} bytes"}
    if done != size or got != want:
        os.unlink(tmp)
        return {"type": "result", "ok": False, "corrupt": True,
                "error": f"{name}: got {done:,} bytes, sha256 {got}; the manifest says {size:,} bytes, sha256 {want}"}
    os.replace(tmp, final)
    return {"type": "result", "ok": True, "bytes": done - resumed, "resumed": resumed}


def fs_type(path: str) -> str:
    """The type of the filesystem holding `path` (the longest mount point above it in /proc/mounts)."""
    real, best, kind = os.path.realpath(path), "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, parts[2]
    except OSError:
        pass
    return kind


def existing(path: str) -> str:
    """The checkpoint directory, or the deepest directory above it that exists (nothing is made)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def mark(spec: dict[str, Any]) -> dict[str, Any]:
    """Leave an empty dot-file in the checkpoint directory (or the deepest one above it that exists) for the other
    nodes to look for."""
    at = existing(spec["path"])
    try:
        with open(os.path.join(at, spec["name"]), "xb"):
            pass
    except OSError as exc:  # a read-only mount: this node cannot tell whom it shares storage with
        return {"type": "result", "ok": False, "error": str(exc), "at": at, "fs": fs_type(at)}
    return {"type": "result", "ok": True, "at": at, "fs": fs_type(at)}


def marks(spec: dict[str, Any]) -> dict[str, Any]:
    """The marks this node sees where it would leave its own."""
    try:
        names = [n for n in os.listdir(existing(spec["path"])) if n.startswith(spec["prefix"])]
    except OSError:
        names = []
    return {"type": "result", "ok": True, "names": sorted(names)}


def unmark(spec: dict[str, Any]) -> dict[str, Any]:
    """Remove this node's mark (from where `mark` left it)."""
    try:
        os.unlink(os.path.join(spec["at"], spec["name"]))
    except OSError:
        pass
    return {"type": "result", "ok": True}


def main(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run the op the spec names."""
    if spec["op"] == "space":
        return space(spec)
    if spec["op"] in ("mark", "marks", "unmark"):
        return {"mark": mark, "marks": marks, "unmark": unmark}[spec["op"]](spec)
    if spec["op"] == "serve":
        serve(spec)
        return None
    return fetch(spec)


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
