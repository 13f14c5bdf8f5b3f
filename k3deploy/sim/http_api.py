"""The engine's HTTP surface on ThreadingHTTPServer: the head's API, or an SGLang worker's dummy /health."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Generator
from contextlib import closing
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from k3deploy.sim.chat_service import ApiError, ChatService, Reply
from k3deploy.sim.log_format import EngineLog
from k3deploy.sim.metrics import CONTENT_TYPE
from k3deploy.sim.routes import post_route

NOT_FOUND = {"detail": "Not Found"}
MAX_BODY_BYTES = 64 << 20


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset or closed mid-request) is routine, as uvicorn treats it: no line.
        socketserver's default prints a traceback, which a log scan for "Traceback" takes for a crash."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn; the OpenAI client reuses connections
    # uvicorn (asyncio) sets TCP_NODELAY; without it Nagle holds each small SSE chunk for the client's ACK.
    disable_nagle_algorithm = True
    api: ApiServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the stdlib's own access log (uvicorn's is written in _send)."""

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = (
            body
            if isinstance(body, bytes)
            else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.api.access_log(self.client_address, self.command, self.path, status)

    def _stream(self, chunks: Generator[dict[str, Any], None, None]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        # Each chunk is written as the engine produces it; closing the iterator (the client went away)
        # frees the request's running slot at once.
        with closing(chunks):
            try:
                for chunk in chunks:
                    self._event(f"data: {json.dumps(chunk)}\n\n")
                self._event("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
        self.api.access_log(self.client_address, self.command, self.path, 200)

    def _event(self, event: str) -> None:
        data = event.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        """GET routes."""
        path = self.path.split("?", 1)[0]
        if path == "/flush_cache":  # SGLang takes it as GET or POST
            self.do_POST()
            return
        status, body, kind = self.api.get(path)
        self._send(status, body, kind)

    def do_POST(self) -> None:
        """POST routes."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, MAX_BODY_BYTES)) if length else b""
        path = self.path.split("?", 1)[0]
        service = self.api.service
        route = post_route(service, path) if service is not None else None
        if route is None or service is None:
            status, body, kind = (
                self.api.get(path) if path == "/ping" else (404, NOT_FOUND, "application/json")
            )
            self._send(status, body, kind)
            return
        try:
            try:
                request = json.loads(raw or b"null")
            except ValueError as exc:
                raise ApiError(400, f"Invalid JSON body: {exc}") from exc
            reply = route(request)
        except ApiError as err:
            self._send(err.status, service.error_body(err))
            return
        if isinstance(reply, Reply) and reply.chunks is not None:
            self._stream(reply.chunks)
        elif isinstance(reply, Reply):
            self._send(200, reply.body)
        else:
            status, body, kind = reply
            self._send(status, body, kind)


class ApiServer:
    """Routes and the listening socket; `service` is None on an SGLang worker (dummy /health only)."""

    def __init__(
        self,
        service: ChatService | None,
        log: EngineLog,
        host: str,
        port: int,
        server_info: dict[str, Any] | None = None,
    ) -> None:
        self.service = service
        self.log = log
        self.server_info = server_info or {}
        handler = type("Handler", (_Handler,), {"api": self})
        self.httpd = (_Server6 if ":" in host else _Server)((host, port), handler)
        self.host, self.port = host, self.httpd.server_address[1]

    def start(self) -> threading.Thread:
        """Serve in a daemon thread."""
        thread = threading.Thread(target=self.httpd.serve_forever, name="k3sim-http", daemon=True)
        thread.start()
        return thread

    def access_log(self, client: Any, method: str, path: str, status: int) -> None:
        """uvicorn's access line."""
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        line = f'INFO:     {client[0]}:{client[1]} - "{method} {path} HTTP/1.1" {status} {phrase}'
        self.log.raw(f"(APIServer pid={os.getpid()}) {line}" if self.log.mimic == "vllm" else line)

    def get(self, path: str) -> tuple[int, Any, str]:
        """(status, body, content type) for a GET route."""
        json_type = "application/json"
        s = self.service
        if s is None:  # SGLang worker nodes: a dummy health server that always says yes
            return (
                (200, b"", "text/plain")
                if path in ("/health", "/health_generate")
                else (404, NOT_FOUND, json_type)
            )
        sglang = s.cfg.mimic == "sglang"
        # SGLang's head stuck in a collective, vLLM's before a request finds its peer gone: both still say yes.
        healthy = s.state == "ready" or s.state == ("stalled" if sglang else "peer_lost")
        if path == "/health" or (path == "/ping" and not sglang):
            return (200, b"", "text/plain") if healthy else (503, b"", "text/plain")
        if sglang and path in ("/health_generate", "/ready"):
            if path == "/health_generate" and s.state == "stalled":
                try:
                    s.chat({"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1})
                except ApiError as err:
                    return err.status, s.error_body(err), json_type
            return (200, b"", "text/plain") if s.state == "ready" else (503, b"", "text/plain")
        if path == "/v1/models":
            return 200, s.models(), json_type
        if path == "/metrics" and (s.cfg.metrics or not sglang):
            return 200, s.metrics.render(), CONTENT_TYPE
        if path in ("/server_info", "/get_server_info") and (
            sglang or os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        ):
            return 200, self.server_info, json_type
        if sglang and path in ("/model_info", "/get_model_info"):
            return (
                200,
                {
                    "model_path": s.cfg.model_path,
                    "tokenizer_path": s.cfg.model_path,
                    "is_generation": True,
                    "preferred_sampling_params": None,
                },
                json_type,
            )
        if not sglang and path == "/version":
            return 200, {"version": s.cfg.version}, json_type
        return 404, NOT_FOUND, json_type

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
