"""`k3deploy weights sync` on a node, stdlib only (shipped by source as `python3 -c PROGRAM SPEC_JSON`).

SPEC_JSON's "op":
- "space": {"path"} -> the free bytes (statvfs) where the checkpoint directory is or will be made;
- "serve": {"path", "ip", "idle_s"?} -> serve the directory's files (final names only) over HTTP with byte
  ranges on ip, port chosen by the kernel; prints {"type": "serving", "port": N} first, then serves until
  killed, or until no request has come or been answered for idle_s (default IDLE_S: a sync killed outright
  leaves no server behind for long);
- "chain": {"path", "ip", "plan", "stall_s"?, "idle_s"?} -> "serve", and once the plan file (JSON: "files", each
  {"name", "size", "sha256"}, in order; "feeders": node URLs nearest first, then the source's URL or "put") is
  there, each file pulled to a temporary name beside its final one (resuming a partial one with a Range
  request; from the first feeder that gives it, the next where one fails; "put": asks this machine for it with a
  {"type": "want"} line, then takes it from put_name), its sha256 checked against the manifest's, fsync'd and
  renamed while the next file comes: a file at its final name is always the manifest's. While a file arrives its
  bytes are served on, all but the last until it is verified (a node after this one never completes a file this
  one refuses); one refused here answers 409 (the node after drops what it has of it), one this node will not
  have 410. A full disk drops the partial file, answers "full" with the free bytes left, and stops the pulls.
  Prints {"type": "progress", "name", "done", "total"} and {"type": "file", "name", "ok", ...} lines, then
  {"type": "done"}, and serves on until killed (or idle for idle_s);
- "mark": {"path", "name"} -> an empty file of that (dot) name in the checkpoint directory, or in the deepest
  directory above it that exists (nothing is made), where it was left ("at") and the type of the filesystem
  holding it (from /proc/mounts): nodes that see it share this storage;
- "marks": {"path", "prefix"} -> the names there that start with `prefix` (the marks this node sees);
- "unmark": {"at", "name"} -> the mark removed.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import http.client
import http.server
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

READ_BUFFER = 8 << 20
STREAM_CHUNK = 1 << 20  # a node passes bytes on as soon as it has this many (a hop's delay is about this)
PART_SUFFIX = ".k3part"
PUT_SUFFIX = ".k3put"
IDLE_S = 900.0  # a server with no request for this long exits (its sync is gone)
STALL_S = 600.0  # a feeder that sends nothing for this long is given up for the next one


def temp_name(root: str, name: str) -> str:
    """The temporary file beside `name`'s final path (a dot file: listings and the server skip it)."""
    head, base = os.path.split(os.path.join(root, name))
    return os.path.join(head, f".{base}{PART_SUFFIX}")


def put_name(root: str, name: str) -> str:
    """Where a file put by this machine's executor appears whole (moved there once the put is done)."""
    head, base = os.path.split(os.path.join(root, name))
    return os.path.join(head, f".{base}{PUT_SUFFIX}")


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


class _Want:
    """A file this node is getting: how much of it is at its temporary name, and whether it is verified. Shared
    by the puller (which writes it) and the server (which passes it on while it arrives)."""

    def __init__(self, name: str, size: int, sha256: str) -> None:
        self.name, self.size, self.sha256 = name, size, sha256
        self.have = 0
        self.state = "pending"  # receiving, verified, failed (this node will not have it), corrupt
        self.cond = threading.Condition()

    def passable(self) -> int:
        """How much of it may go on to the next node: all once verified, else all that is here but the last byte
        (held under `cond`)."""
        return self.size if self.state == "verified" else min(self.have, self.size - 1)

    def beyond(self, pos: int) -> bool:
        """More than `pos` bytes may go on, or no more will come."""
        return self.passable() > pos or self.state != "receiving"

    def settle(self, state: str) -> None:
        with self.cond:
            self.state = state
            self.cond.notify_all()


_WANTS: dict[str, _Want] = {}
_PLANNED = threading.Event()  # set once _WANTS is filled (a plain server has none)
_OUT = threading.Lock()


def _say(**line: Any) -> None:
    with _OUT:
        print(json.dumps(line), flush=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    root = "/"
    busy = 0  # requests being answered
    last = 0.0  # when the last one started or ended (monotonic)
    working = False  # the node's puller still gets files (its server must not exit idle)
    stall_s = STALL_S
    lock = threading.Lock()

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        with _Handler.lock:
            _Handler.busy += 1
            _Handler.last = time.monotonic()
        try:
            self._answer()
        except OSError:  # the node downstream went away: it resumes from another
            pass
        finally:
            with _Handler.lock:
                _Handler.busy -= 1
                _Handler.last = time.monotonic()

    def _answer(self) -> None:
        name = urllib.request.url2pathname(self.path.lstrip("/"))
        path = os.path.join(self.root, name)
        if not inside(self.root, name) or os.path.basename(path).startswith("."):
            self.send_error(404)
            return
        if not _PLANNED.wait(self.stall_s):
            self.send_error(503, "no plan yet")
            return
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].rstrip("-").isdigit():
            start = int(rng[6:].rstrip("-"))
        want = _WANTS.get(name)
        if want is not None:
            with want.cond:  # the file opened under the lock its rename takes: the one being written, or verified
                want.cond.wait_for(lambda: want.state != "pending", self.stall_s)
                state = want.state
                f = open(path if state == "verified" else temp_name(self.root, name), "rb") \
                    if state in ("receiving", "verified") else None  # noqa: SIM115 (closed by _stream)
            if f is not None:
                self._stream(want, f, min(start, want.size))
            else:  # 409: its bytes were not the manifest's; 410: this node will not have it; 503: not begun
                self.send_error({"corrupt": 409, "failed": 410}.get(state, 503), state)
            return
        if not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start = min(start, size)
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

    def _stream(self, want: _Want, f: Any, pos: int) -> None:
        """A file still arriving, passed on as it comes; its last byte only once it is verified here, so what
        the node downstream completes is what this one verified (a file failed here ends its stream short)."""
        with f:
            self.send_response(206 if pos else 200)
            self.send_header("Content-Length", str(want.size - pos))
            self.end_headers()
            f.seek(pos)
            while pos < want.size:
                with want.cond:
                    if not want.cond.wait_for(functools.partial(want.beyond, pos), self.stall_s) or \
                            want.state not in ("receiving", "verified"):
                        return
                    end = want.passable()
                while pos < end:
                    chunk = f.read(min(READ_BUFFER, end - pos))
                    if not chunk:
                        return
                    self.wfile.write(chunk)
                    pos += len(chunk)


def _listen(spec: dict[str, Any]) -> http.server.ThreadingHTTPServer:
    os.makedirs(spec["path"], exist_ok=True)
    _Handler.root = os.path.realpath(spec["path"])
    _Handler.stall_s = float(spec.get("stall_s", STALL_S))
    server = http.server.ThreadingHTTPServer((spec["ip"], 0), _Handler)
    server.daemon_threads = True
    _Handler.last = time.monotonic()
    idle_s = float(spec.get("idle_s", IDLE_S))

    def watch() -> None:  # a sync killed outright (SIGKILL) cannot stop its servers: each ends once idle
        while True:
            time.sleep(min(idle_s, 5.0))
            with _Handler.lock:
                if not _Handler.busy and not _Handler.working and time.monotonic() - _Handler.last > idle_s:
                    os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    return server


def serve(spec: dict[str, Any]) -> None:
    """Serve the checkpoint directory until killed."""
    server = _listen(spec)
    _PLANNED.set()
    _say(type="serving", port=server.server_address[1])
    server.serve_forever()


class _Full(Exception):
    """The disk filled while a file was written."""


class _Corrupt(Exception):
    """A node upstream found the file's bytes not the manifest's."""


def _read_plan(path: str, wait_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                plan: dict[str, Any] = json.load(f)
            return plan
        except (OSError, ValueError):  # not there yet, or still being written
            if time.monotonic() > deadline:
                raise SystemExit(f"no plan at {path} after {wait_s:g} s") from None
            time.sleep(0.05)


class _Pull:
    """One file's bytes appended to its temporary name, hashed as they come, from the first feeder that gives
    them (a node before this one, passing them on as they arrive; the source; or a put by the executor)."""

    def __init__(self, root: str, want: _Want, stall_s: float) -> None:
        self.root, self.want, self.stall_s = root, want, stall_s
        self.tmp = temp_name(root, want.name)
        self.h = hashlib.sha256()
        self.done = self.resumed = 0
        self.last = [time.monotonic()]
        self.out: Any = None
        self.error = ""

    def _append(self, chunk: bytes) -> None:
        try:
            self.out.write(chunk)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _Full(str(exc)) from None
            raise
        self.h.update(chunk)
        self.done += len(chunk)
        with self.want.cond:
            self.want.have = self.done
            self.want.cond.notify_all()
        now = time.monotonic()
        if now - self.last[0] >= 1.0:
            self.last[0] = now
            _say(type="progress", name=self.want.name, done=self.done, total=self.want.size)

    def open(self) -> None:
        w = self.want
        if os.path.exists(self.tmp) and os.path.getsize(self.tmp) > w.size:
            os.unlink(self.tmp)
        if os.path.exists(self.tmp):  # a partial file to resume: hash what is there
            with open(self.tmp, "rb") as f:
                for chunk in iter(lambda: f.read(READ_BUFFER), b""):
                    self.h.update(chunk)
                    self.done += len(chunk)
        self.resumed = self.done
        self.out = open(self.tmp, "ab", buffering=0)  # noqa: SIM115 (closed once the file is done or given up)
        with w.cond:
            w.have, w.state = self.done, "receiving"
            w.cond.notify_all()

    def from_url(self, base: str) -> str | int | None:
        """Bytes from base/NAME: None when it gave some, else why not (an HTTP status, or an error's text)."""
        w = self.want
        url = f"{base}/{urllib.parse.quote(w.name)}"
        req = urllib.request.Request(url, headers={"Range": f"bytes={self.done}-"} if self.done else {})
        before = self.done
        try:
            with urllib.request.urlopen(req, timeout=self.stall_s) as resp:
                if self.done and resp.status != 206:
                    return f"{url}: no range support"
                read = getattr(resp, "read1", resp.read)
                while self.done < w.size:
                    chunk = read(min(STREAM_CHUNK, w.size - self.done))
                    if not chunk:
                        break
                    self._append(chunk)
        except urllib.error.HTTPError as exc:  # answered, but not with the file (a hub: 404 and why)
            if exc.code == 409:
                raise _Corrupt(f"{url}: that node found its bytes not the manifest's") from None
            why = exc.headers.get("X-Error-Code") or exc.reason
            self.error = f"{w.name}: {url}: HTTP {exc.code} {why}"
            return exc.code
        except (OSError, http.client.HTTPException) as exc:  # the feeder went away: the partial file is kept
            if self.done == before:
                return f"{w.name}: {url}: {exc!r}"
        return None if self.done > before else f"{w.name}: {url} sent nothing"

    def from_put(self) -> str | None:
        """The executor puts the whole file (asked for by a "want" line); its bytes past what is here are taken."""
        w, put = self.want, put_name(self.root, self.want.name)
        if os.path.exists(put):
            os.unlink(put)
        _say(type="want", name=w.name)
        deadline = time.monotonic() + self.stall_s
        while not os.path.exists(put):
            if time.monotonic() > deadline:
                return f"{w.name}: no put after {self.stall_s:g} s"
            time.sleep(0.05)
        with open(put, "rb") as f:
            f.seek(self.done)
            for chunk in iter(lambda: f.read(READ_BUFFER), b""):
                self._append(chunk)
        os.unlink(put)
        return None

    def run(self, feeders: list[str]) -> dict[str, Any]:
        """The file's bytes from the feeders in turn (each resumed where the last stopped); the result line."""
        w, i, error, status = self.want, 0, "", None
        self.open()
        while self.done < w.size and i < len(feeders):
            got = self.from_put() if feeders[i] == "put" else self.from_url(feeders[i])
            if got is None:
                continue  # some bytes came: this feeder again, from where it stopped
            if isinstance(got, int):
                error, status = self.error, got
            else:
                error, status = got, None
            i += 1
        source = i >= len(feeders) - 1
        if self.done < w.size:  # every feeder failed: not corrupt, the partial file is kept to resume
            self.out.close()
            return {"ok": False, "source": source, "status": status, "error": error or
                    f"{w.name}: the transfer ended after {self.done:,} of {w.size:,} bytes"}
        return {"ok": True, "source": source}


def _finish(pull: _Pull, root: str) -> dict[str, Any]:
    """Checked against the manifest, made durable, renamed: the file's result line."""
    w = pull.want
    pull.out.flush()
    os.fsync(pull.out.fileno())
    pull.out.close()
    got = pull.h.hexdigest()
    if pull.done != w.size or got != w.sha256:
        os.unlink(pull.tmp)
        w.settle("corrupt")
        return {"ok": False, "corrupt": True, "error": f"{w.name}: got {pull.done:,} bytes, sha256 {got}; the "
                f"manifest says {w.size:,} bytes, sha256 {w.sha256}"}
    with w.cond:
        os.replace(pull.tmp, os.path.join(root, w.name))
        w.state = "verified"
        w.cond.notify_all()
    return {"ok": True, "bytes": pull.done - pull.resumed, "resumed": pull.resumed}


def chain(spec: dict[str, Any]) -> None:
    """Serve the directory, then get the plan's files in order, passing each on while it arrives; verified
    files finish (fsync, rename) while the next one comes."""
    server = _listen(spec)
    root = _Handler.root
    _Handler.working = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _say(type="serving", port=server.server_address[1])
    stall_s = _Handler.stall_s
    plan = _read_plan(spec["plan"], float(spec.get("idle_s", IDLE_S)))
    wants = [_Want(f["name"], int(f["size"]), f["sha256"]) for f in plan["files"]]
    for w in wants:
        _WANTS[w.name] = w
        os.makedirs(os.path.dirname(os.path.join(root, w.name)), exist_ok=True)
    _PLANNED.set()
    finishing: list[threading.Thread] = []
    stopped = ""

    def finish(pull: _Pull, source: bool) -> None:
        try:
            out = _finish(pull, root)
        except OSError as exc:  # fsync or rename refused (a full or failing disk): nothing at its final name
            if os.path.exists(pull.tmp):
                os.unlink(pull.tmp)
            pull.want.settle("failed")
            out = {"ok": False, "error": f"{pull.want.name}: {exc}"}
            if exc.errno == errno.ENOSPC:
                out.update(full=True, free=space({"path": root})["free"])
        _say(type="file", name=pull.want.name, source=source, **out)

    for w in wants:
        if stopped:
            w.settle("failed")
            _say(type="file", name=w.name, ok=False, skipped=True, error=stopped)
            continue
        pull = _Pull(root, w, stall_s)
        try:
            out = pull.run(list(plan["feeders"]))
        except _Full as exc:
            pull.out.close()
            os.unlink(pull.tmp)
            w.settle("failed")
            stopped = f"{w.name}: {exc}"
            for t in finishing:  # what was verified before stays; the free space is what is left after it
                t.join()
            _say(type="file", name=w.name, ok=False, full=True, free=space({"path": root})["free"], error=stopped)
            continue
        except _Corrupt as exc:  # what came here of it is dropped: the node before found it wrong
            pull.out.close()
            os.unlink(pull.tmp)
            w.settle("corrupt")
            _say(type="file", name=w.name, ok=False, corrupt=True, upstream=True, error=f"{w.name}: {exc}")
            continue
        except OSError as exc:
            w.settle("failed")
            _say(type="file", name=w.name, ok=False, error=f"{w.name}: {exc}")
            continue
        if not out["ok"]:
            w.settle("failed")
            _say(type="file", name=w.name, **out)
            continue
        for t in finishing:  # one file finishing at a time, in order
            t.join()
        finishing = [threading.Thread(target=finish, args=(pull, out["source"]))]
        finishing[0].start()
    for t in finishing:
        t.join()
    _say(type="done")
    _Handler.working = False
    with _Handler.lock:
        _Handler.last = time.monotonic()
    threading.Event().wait()  # serving on until the sync stops this process (or it is idle for idle_s)


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
    else:
        chain(spec)
    return None


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
