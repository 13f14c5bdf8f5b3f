"""A client that resets an idle keep-alive connection: real vLLM (uvicorn) logs nothing; the stand-in's
stdlib server printed a socketserver traceback (`ConnectionResetError: [Errno 104]`), which anything that
scans engine logs for "Traceback" takes for a crash."""
from __future__ import annotations

import socket
import struct
import threading

import pytest

from k3deploy.sim.http_api import ApiServer
from k3deploy.sim.log_format import EngineLog, Ranks
from tests.polling import wait_for

RANKS = Ranks(dp=0, pp=0, tp=0, ep=0, world_rank=0, world_size=1)


def _handlers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request_thread" in repr(getattr(t, "_target", None))]


@pytest.mark.parametrize("reset_after_reply", [True, False])
def test_reset_keepalive_connection_logs_no_traceback(capsys: pytest.CaptureFixture[str],
                                                      reset_after_reply: bool) -> None:
    log_lines: list[str] = []
    log = EngineLog("sglang", RANKS, stream=_Lines(log_lines))
    api = ApiServer(None, log, "127.0.0.1", 0)
    api.start()
    try:
        conn = socket.create_connection(("127.0.0.1", api.port), timeout=30)
        if reset_after_reply:  # one request answered, then the idle keep-alive connection is reset
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        else:  # reset in the middle of a request line
            conn.sendall(b"GET /hea")
        assert wait_for(lambda: len(_handlers()) >= 1, 30)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        conn.close()
        assert wait_for(lambda: not _handlers(), 60), "the handler thread never ended"
    finally:
        api.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err
    assert not any("Traceback" in line for line in log_lines)


class _Lines:
    """A text stream that keeps what is written."""

    def __init__(self, into: list[str]) -> None:
        self.into = into

    def write(self, text: str) -> int:
        self.into.append(text)
        return len(text)

    def flush(self) -> None:
        """Nothing buffered."""
