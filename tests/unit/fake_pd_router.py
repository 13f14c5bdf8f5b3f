"""A fake router in PD mode and fake prefill/decode instances on loopback, recording what rollout asks of them.
It answers as smg 1.13.0 was seen to (k3deploy/engines/router_api.py): GET /workers lists each worker with its
id, url, worker_type, is_healthy, status; DELETE /workers/{id} answers 202 and lists it `draining` (unhealthy)
for one more look, then drops it; POST /workers {"url", "worker_type", "bootstrap_port"} answers 202 and lists
it ready, as `regular` when no worker_type was given, and, like smg in PD mode, never routes to a regular
worker; a completion needs a healthy prefill and decode (503 otherwise) and grows both instances' prompt-token
counts, which each instance's /metrics shows."""
from __future__ import annotations

import itertools
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.ports import free_port


@dataclass
class Worker:
    id: str
    url: str
    worker_type: str
    bootstrap_port: int | None
    status: str = "ready"
    looks_left: int = 1  # a draining worker is listed this many more times


@dataclass
class FakeRouter:
    workers: list[Worker]
    prompts: dict[str, int]  # instance URL -> prompt tokens it processed
    calls: list[tuple[str, str, Any]] = field(default_factory=list)  # (method, path, body) of membership calls
    fewest_healthy: dict[str, int] = field(default_factory=dict)  # role -> fewest healthy seen at any look
    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(100))
    turn: Iterator[int] = field(default_factory=itertools.count)
    broken: bool = False  # every completion fails (a router that cannot serve, whoever is in)

    def listing(self) -> dict[str, Any]:
        with self.lock:
            for role in ("prefill", "decode"):
                healthy = sum(1 for w in self.workers if w.worker_type == role and w.status == "ready")
                self.fewest_healthy[role] = min(self.fewest_healthy.get(role, healthy), healthy)
            rows = [{"id": w.id, "url": w.url, "worker_type": w.worker_type, "is_healthy": w.status == "ready",
                     "status": w.status, **({"bootstrap_port": w.bootstrap_port} if w.bootstrap_port else {})}
                    for w in self.workers]
            for w in list(self.workers):
                if w.status == "draining":
                    w.looks_left -= 1
                    if w.looks_left < 0:
                        self.workers.remove(w)
            return {"workers": rows, "total": len(rows)}

    def complete(self) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.broken:
                return 502, {"error": {"message": "upstream connect error"}}
            n = next(self.turn)
            pair = []
            for role in ("prefill", "decode"):
                ready = [w for w in self.workers if w.worker_type == role and w.status == "ready"]
                if not ready:
                    return 503, {"error": {"message": f"No available {role} workers"}}
                pair.append(ready[n % len(ready)])
            for w in pair:
                self.prompts[w.url] = self.prompts.get(w.url, 0) + 5
            return 200, {"choices": [{"index": 0, "text": "ok"}]}


def _handler(router: FakeRouter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, doc: Any, text: str | None = None) -> None:
            data = (text if text is not None else json.dumps(doc)).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            size = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(size)) if size else None

        def do_GET(self) -> None:
            host = f"http://{self.headers['Host']}"
            if self.path == "/workers":
                self._send(200, router.listing())
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": "kimi-k3-tiny"}]})
            elif self.path == "/metrics":
                count = router.prompts.get(host, 0)
                self._send(200, None, f'sglang:prompt_tokens_total{{model_name="m"}} {count}.0\n'
                                      'sglang:num_running_reqs{model_name="m"} 0.0\n')
            else:
                self._send(404, {"error": self.path})

        def do_POST(self) -> None:
            body = self._body()
            if self.path == "/v1/completions":
                self._send(*router.complete())
                return
            router.calls.append(("POST", self.path, body))
            if self.path != "/workers":
                self._send(404, {"error": self.path})
                return
            with router.lock:
                if any(w.url == body["url"] for w in router.workers):
                    self._send(409, {"error": "Worker already exists", "code": "WORKER_ALREADY_EXISTS"})
                    return
                w = Worker(f"id{next(router.ids)}", body["url"], body.get("worker_type", "regular"),
                           body.get("bootstrap_port"))
                router.workers.append(w)
            self._send(202, {"status": "accepted", "worker_id": w.id})

        def do_DELETE(self) -> None:
            router.calls.append(("DELETE", self.path, None))
            wid = urllib.parse.unquote(self.path.rsplit("/", 1)[-1])
            with router.lock:
                hit = [w for w in router.workers if w.id == wid]
                for w in hit:
                    w.status = "draining"
            self._send(202 if hit else 404, {"status": "accepted"} if hit else {"error": "Worker not found"})

    return Handler


@contextmanager
def serving(router: FakeRouter, urls: list[str]) -> Iterator[str]:
    """The router on a free loopback port and each instance URL answering /metrics; yields the router's URL."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(router))]
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        servers.append(ThreadingHTTPServer((parts.hostname or "", parts.port or 0), _handler(router)))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield f"http://127.0.0.1:{servers[0].server_address[1]}"
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
        for t in threads:
            t.join(10)


def free_base() -> int:
    """An engine port P with P..P+3 free on each of 127.0.0.1..4 (the test topologies' nodes; an instance or
    replica serves on one of them at P + its number): tests/ports.py's blocks are free on every address."""
    return free_port()
