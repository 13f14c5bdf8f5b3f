"""A Hugging Face hub on loopback for `weights sync --from hub` tests: one repo at one commit, its files served from
a directory the way huggingface_hub downloads them (HEAD for the commit, ETag and size, then GET, with Range
for a resumed download; 404 with the hub's X-Error-Code for a missing repo, revision or file), every GET
recorded. With `cdn`, a GET of a resolve URL is redirected (302) to a /cdn/ path that serves the bytes, as
huggingface.co sends LFS files to its CDN (what `weights sync --from hub` nodes follow). Point HF_ENDPOINT at
`url` (huggingface_hub reads it at import: set it in the environment of the process under test)."""
from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, unquote


class FakeHub:
    """`repo` at `commit`, its files under `root`; `gets` lists each file served by GET, in order."""

    def __init__(self, repo: str, commit: str, root: Path, cdn: bool = False) -> None:
        self.repo, self.commit, self.root, self.cdn = repo, commit, root, cdn
        self.gets: list[str] = []
        self.url = ""

    def _file(self, path: str) -> tuple[int, dict[str, str], Path | None]:
        cdn = re.fullmatch(r"/cdn/(.+)", unquote(path.split("?")[0]))
        if self.cdn and cdn is not None:
            local = self.root / cdn[1]
            return (200, {"Accept-Ranges": "bytes"}, local) if local.is_file() else (404, {}, None)
        m = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", unquote(path.split("?")[0]))
        if m is None or m[1] != self.repo:
            return 404, {"X-Error-Code": "RepoNotFound"}, None
        if m[2] != self.commit:
            return 404, {"X-Error-Code": "RevisionNotFound"}, None
        local = self.root / m[3]
        if not local.is_file():
            return 404, {"X-Error-Code": "EntryNotFound"}, None
        sha = hashlib.sha256(local.read_bytes()).hexdigest()
        return 200, {"X-Repo-Commit": self.commit, "ETag": f'"{sha}"', "Accept-Ranges": "bytes"}, local

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body: bool) -> None:
                code, headers, local = hub._file(self.path)
                data = local.read_bytes() if local is not None else b""
                start = 0
                ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if ranged and local is not None and int(ranged[1]) < len(data):
                    start, code = int(ranged[1]), 206
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if body and local is not None:
                    hub.gets.append(str(local.relative_to(hub.root)))
                    self.wfile.write(data[start:])

            def do_HEAD(self) -> None:
                self._answer(False)

            def do_GET(self) -> None:
                _, _, local = hub._file(self.path)
                if hub.cdn and local is not None and not self.path.startswith("/cdn/"):
                    self.send_response(302)
                    self.send_header("Location", f"/cdn/{quote(str(local.relative_to(hub.root)))}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self._answer(True)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@contextmanager
def fake_hub(repo: str, commit: str, root: Path, cdn: bool = False) -> Iterator[FakeHub]:
    """The hub serving on a free loopback port until the block ends."""
    hub = FakeHub(repo, commit, root, cdn)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), hub.handler())
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
