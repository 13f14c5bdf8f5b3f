"""NodeHttp sends a request once more when its connection drops before any answer (a pooled keep-alive
connection reset as it is reused: the clean-clone run's `short` stage error "Connection reset by peer" through a
jump host's tunnel), and names a server that resets every time."""
from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from k3deploy.executors.http import HttpFailure, NodeHttp

pytestmark = pytest.mark.timeout(60)
BODY = b'{"ok": true}'
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)


@contextmanager
def server(resets: int) -> Iterator[tuple[str, list[int]]]:
    """One listener on loopback: its first `resets` connections are reset (RST) once the request arrives, the
    rest answered 200; yields its URL and the count of connections seen."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    seen, stop = [0], threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                conn.recv(65536)
                seen[0] += 1
                if seen[0] <= resets:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close as RST
                else:
                    conn.sendall(ANSWER)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", seen
    finally:
        stop.set()
        t.join(timeout=10)
        sock.close()


def test_a_reset_before_any_answer_is_sent_once_more() -> None:
    with server(resets=1) as (url, seen), NodeHttp(url) as http:
        reply = http.post("/v1/chat/completions", {"messages": []})
    assert reply.status == 200 and reply.json() == {"ok": True} and seen[0] == 2


def test_a_server_that_resets_every_time_is_named() -> None:
    named = r"POST http://127\.0\.0\.1:\d+/v1/chat/completions: .* \(twice\)"
    with server(resets=10) as (url, seen), NodeHttp(url) as http, pytest.raises(HttpFailure, match=named):
        http.post("/v1/chat/completions", {"messages": []})
    assert seen[0] == 2
