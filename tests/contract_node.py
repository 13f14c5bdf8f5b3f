"""The node the executor contract's tests run on: one node of some executor kind, and an HTTP server to start
on it."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from k3deploy.executors.base import Executor
from k3deploy.executors.target import ExecTarget

# A tiny HTTP server for the node side: GET echoes the path, POST streams server-sent events.
HTTP_SERVER = r'''
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = json.dumps({"path": self.path, "served_by": sys.argv[3]}).encode()
        self.send_response(200 if self.path != "/missing" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        n = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["n"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(n):
            self.wfile.write(f"data: {json.dumps({'i': i})}\n\n".encode()); self.wfile.flush(); time.sleep(0.05)
        self.wfile.write(b"data: [DONE]\n\n"); self.wfile.flush()
    def log_message(self, *a):
        pass
ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
'''


@dataclass
class ContractNode:
    """One node of some executor kind, as the contract tests use it."""

    kind: str
    target: ExecTarget
    scratch: Path  # a directory this machine and the node both see (the rig shares the filesystem)
    serve_http: Callable[[str, int], Callable[[], None]]  # start HTTP_SERVER on the node at (ip, port); -> stop
    node_ip: str  # an address of the node that this machine may not reach (the rig: private network)

    def executor(self) -> Executor:
        from k3deploy.executors.factory import open_executor

        ex = open_executor(self.target)
        ex.connect()
        return ex

    def tag(self) -> str:
        return f"contract-{self.kind}.0.{uuid.uuid4().hex[:8]}"


@contextmanager
def opened(node: ContractNode) -> Iterator[Executor]:
    ex = node.executor()
    try:
        yield ex
    finally:
        ex.close()


def http_server(ip: str, port: int, name: str, prefix: Sequence[str] = ()) -> Callable[[], None]:
    """HTTP_SERVER started under `prefix` (e.g. nsenter into a rig host), in its own process group; the
    returned callable kills the group."""
    proc = subprocess.Popen([*prefix, sys.executable, "-c", HTTP_SERVER, ip, str(port), name],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    return stop
