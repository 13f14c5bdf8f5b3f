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
from k3deploy.executors.tunnel import Tunnel

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


class _Via:
    """An executor that only forwards: through a tunnel whose node cannot open the channel."""

    host = "h0"

    def __init__(self, tunnel: Tunnel) -> None:
        self.tunnel = tunnel

    def forward(self, remote_host: str, remote_port: int) -> Tunnel:
        return self.tunnel


def test_a_tunnel_that_cannot_open_its_channel_says_why_in_the_failure() -> None:
    tried: list[tuple[str, int]] = []

    def refuse(peer: tuple[str, int]) -> None:
        tried.append(peer)
        raise ConnectionRefusedError("Connect failed")

    named = r"POST http://10\.0\.0\.1:18000/v1/chat/completions: .* \(twice\) \(no channel h0 -> 10\.0\.0\.1:18000: " \
            r"ConnectionRefusedError: Connect failed\)"
    with Tunnel(refuse, "h0 -> 10.0.0.1:18000") as tunnel, \
            NodeHttp("http://10.0.0.1:18000", via=_Via(tunnel)) as http, \
            pytest.raises(HttpFailure, match=named):  # type: ignore[arg-type]
        http.post("/v1/chat/completions", {"messages": []})
    assert len(tried) == 2


class _Transport:
    def __init__(self, answers: list[object]) -> None:
        self.answers = answers

    def open_channel(self, *args: object, **kwargs: object) -> object:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class _Client:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport

    def get_transport(self) -> _Transport:
        return self.transport


def test_an_ssh_forward_whose_connection_died_connects_again_but_takes_a_refusal_as_the_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import paramiko

    from k3deploy.executors import ssh
    from k3deploy.executors.target import SshTarget

    monkeypatch.setattr(ssh, "CHANNEL_RETRY_S", 0.0)
    ex = ssh.SshExecutor(SshTarget(host="h0", known_hosts="/dev/null"))
    connects: list[int] = []
    answers: list[object] = [paramiko.SSHException("SSH session not active"), "the channel"]
    monkeypatch.setattr(ex, "connect", lambda: connects.append(1) or setattr(ex, "_client", _Client(_Transport(answers))))
    with ex.forward("10.0.0.1", 18000) as tunnel:
        assert tunnel._open_channel(("127.0.0.1", 5)) == "the channel" and len(connects) == 3  # forward, 2 tries
        answers[:] = [paramiko.ChannelException(2, "Connect failed"), "never asked"]
        with pytest.raises(paramiko.ChannelException):
            tunnel._open_channel(("127.0.0.1", 5))
        assert answers == ["never asked"]
