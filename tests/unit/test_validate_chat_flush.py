"""The prefix-cache stage's cold request on SGLang needs POST /flush_cache, which SGLang refuses (HTTP 400)
while any request runs, other users' too: the flush is retried a bounded number of times, and a refusal
says why and what to do instead of passing unchecked."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from k3deploy.executors.http import NodeHttp
from k3deploy.validate.chat import FLUSH_ATTEMPTS, Chat

pytestmark = pytest.mark.timeout(30)


class Busy(BaseHTTPRequestHandler):
    """An SGLang server with requests running: every flush is refused, as SGLang does."""

    flushes: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.flushes.append(self.path)
        self.send_response(400 if self.path == "/flush_cache" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def busy_url() -> Iterator[str]:
    Busy.flushes = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_refused_flush_is_retried_then_says_to_validate_when_idle(busy_url: str) -> None:
    ctx: Any = SimpleNamespace(topology=SimpleNamespace(
        engine=SimpleNamespace(kind="sglang"), model=SimpleNamespace(id="kimi-k3"),
        validate_=SimpleNamespace(request_timeout_s=10.0)))
    with NodeHttp(busy_url) as http:
        cold, why = Chat(http, ctx).cold([{"role": "user", "content": "hi"}], 16)
    assert cold is None
    assert Busy.flushes == ["/flush_cache"] * FLUSH_ATTEMPTS  # no chat request without a flush
    assert why == (f"POST /flush_cache: HTTP 400 after {FLUSH_ATTEMPTS} tries (SGLang flushes only while no "
                   f"request runs: validate when the server is idle)")
