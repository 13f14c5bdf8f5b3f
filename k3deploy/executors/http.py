"""The one HTTP client of k3deploy (readiness, status, validate): GET, POST with JSON, and server-sent-event
streams, to a URL as seen from here, or as seen from a node: through a port the node's executor forwards
(SSH: direct-tcpip; local: the port itself), or, when it cannot forward (Ray), made on the node itself."""
from __future__ import annotations

import base64
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from typing_extensions import Self

from k3deploy.errors import ExecError
from k3deploy.executors import node_http
from k3deploy.executors.base import Executor, Forward
from k3deploy.executors.fleet import parse_probe_output, probe_source

if TYPE_CHECKING:  # httpx costs ~0.3 s to import: stop, status and logs that ask no node over HTTP skip it
    import httpx

DEFAULT_TIMEOUT_S = 10.0


class HttpFailure(ExecError):
    """No HTTP answer at all (refused, timed out, unreachable): exit 3."""


@dataclass(frozen=True)
class HttpReply:
    """A whole answer."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        """The body as text."""
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON (ValueError if it is not)."""
        return json.loads(self.body)


@dataclass(frozen=True)
class SseEvent:
    """One server-sent-event `data:` payload and when it arrived (seconds after the request was sent)."""

    t_s: float
    data: str


class NodeHttp:
    """Requests to one base URL (e.g. rank 0's http://IP:PORT); `via` None asks from here."""

    def __init__(self, base_url: str, via: Executor | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_reply: Callable[[str, Mapping[str, str]], None] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.via = via
        self.timeout_s = timeout_s
        # Sees (path, response headers) of every answered request: who served, through a router that says.
        self._on_reply = on_reply or (lambda path, headers: None)
        parts = urllib.parse.urlsplit(self.base_url)
        if not parts.hostname:
            raise ValueError(f"not an http URL: {base_url!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._forward: Forward | None = None
        self._on_node = False
        self._client: httpx.Client | None = None

    @property
    def route(self) -> str:
        """here | forwarded | on-node (decided on first use)."""
        self._open()
        return "on-node" if self._on_node else "forwarded" if self._forward is not None else "here"

    def _open(self) -> None:
        if self._client is not None or self._on_node:
            return
        if self.via is not None:
            self._forward = self.via.forward(self._host, self._port)
            self._on_node = self._forward is None
            if self._on_node:
                return
        import httpx

        # Engines' URLs are private addresses: never through a proxy from the environment.
        self._client = httpx.Client(trust_env=False, timeout=self.timeout_s)

    def _url(self, path: str) -> str:
        if self._forward is not None:
            return f"http://{self._forward.local_host}:{self._forward.local_port}{path}"
        return self.base_url + path

    def url_here(self, path: str) -> str | None:
        """The URL that reaches `path` from this machine (through the forward, if any); None: only on the node."""
        self._open()
        return None if self._on_node else self._url(path)

    def _where(self) -> str:
        return self.via.host if self.via is not None else self._host

    def request(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> HttpReply:
        """One request with an optional JSON body; HttpFailure when nothing answers."""
        self._open()
        timeout = timeout_s or self.timeout_s
        if self._on_node:
            reply = self._on_node_request(method, path, body, timeout)
            self._on_reply(path, reply.headers)
            return reply
        assert self._client is not None
        import httpx  # loaded by _open already

        t0 = time.monotonic()
        for attempt in (1, 2):
            try:
                resp = self._client.request(method, self._url(path), json=body, timeout=timeout,
                                            headers={"host": f"{self._host}:{self._port}"})
                break
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
                # The connection dropped before any answer (a pooled keep-alive connection the server or a
                # tunnel closed as it was reused: "Connection reset by peer"): sent once more, on a fresh one.
                # A server that is really gone fails the second time too, and says so.
                if attempt == 2:
                    tunnel = getattr(self._forward, "last_failure", None)  # the forward's side of it, if it knows
                    raise HttpFailure(f"{method} {self.base_url}{path}: {_why(exc)} (twice)"
                                      + (f" ({tunnel})" if tunnel else ""), host=self._where()) from None
            except httpx.HTTPError as exc:
                raise HttpFailure(f"{method} {self.base_url}{path}: {_why(exc)}", host=self._where()) from None
        self._on_reply(path, resp.headers)
        return HttpReply(resp.status_code, resp.content, dict(resp.headers), time.monotonic() - t0)

    def get(self, path: str, timeout_s: float | None = None) -> HttpReply:
        """GET `path`."""
        return self.request("GET", path, None, timeout_s)

    def post(self, path: str, body: Any, timeout_s: float | None = None) -> HttpReply:
        """POST a JSON body to `path`."""
        return self.request("POST", path, body, timeout_s)

    def stream(self, path: str, body: Any, timeout_s: float | None = None) -> Iterator[SseEvent]:
        """POST a JSON body and yield each server-sent-event data payload as it arrives ('[DONE]' included);
        made on the node, the events keep the node's arrival times but reach here when the stream ends."""
        self._open()
        timeout = timeout_s or self.timeout_s
        if self._on_node:
            events: list[SseEvent] = []
            reply = self._on_node_request("POST", path, body, timeout, events)
            self._on_reply(path, reply.headers)
            if not reply.ok:
                raise HttpFailure(f"POST {self.base_url}{path}: HTTP {reply.status}: {reply.text[:300]}",
                                  host=self._where())
            yield from events
            return
        assert self._client is not None
        import httpx  # loaded by _open already

        t0 = time.monotonic()
        try:
            with self._client.stream("POST", self._url(path), json=body, timeout=timeout) as resp:
                self._on_reply(path, resp.headers)
                if resp.status_code >= 300:
                    resp.read()
                    raise HttpFailure(f"POST {self.base_url}{path}: HTTP {resp.status_code}: {resp.text[:300]}",
                                      host=self._where())
                for line in resp.iter_lines():
                    if line.startswith("data:"):
                        yield SseEvent(time.monotonic() - t0, line[5:].lstrip())
        except httpx.HTTPError as exc:
            raise HttpFailure(f"POST {self.base_url}{path}: {_why(exc)}", host=self._where()) from None

    def _on_node_request(self, method: str, path: str, body: Any, timeout_s: float,
                         events: list[SseEvent] | None = None) -> HttpReply:
        assert self.via is not None
        argv = ["python3", "-c", probe_source(node_http), method, self.base_url + path, f"{timeout_s:g}",
                "-" if body is None else json.dumps(body), "stream" if events is not None else "plain"]
        res = self.via.run(argv, timeout_s + 15.0)
        out = parse_probe_output(res, self.via.host)
        if events is not None:
            for line in res.stdout.splitlines()[:-1]:
                item = json.loads(line) if line.startswith("{") else {}
                if "t" in item:
                    events.append(SseEvent(float(item["t"]), str(item["data"])))
        if "error" in out:
            raise HttpFailure(f"{method} {self.base_url}{path} (asked on the node): {out['error']}",
                              host=self.via.host)
        return HttpReply(int(out["status"]), base64.b64decode(out["body_b64"]), out.get("headers", {}),
                         float(out.get("elapsed_s", 0.0)))

    def close(self) -> None:
        """Close the client and any forwarded port."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._forward is not None:
            self._forward.close()
            self._forward = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serving(http: NodeHttp, paths: tuple[str, ...], timeout_s: float = 2.0) -> tuple[bool, str]:
    """Every readiness path answers 2xx, checked in order (health before /v1/models); never raises."""
    for path in paths or ("/health",):
        try:
            reply = http.get(path, timeout_s)
        except ExecError as exc:
            return False, f"{path}: {str(exc).split(': ', 1)[-1]}"
        if not reply.ok:
            return False, f"{path}: HTTP {reply.status}"
    return True, ""


def completes(http: NodeHttp, timeout_s: float = 60.0) -> tuple[bool, int, str]:
    """(answered, HTTP status, why not): a one-token completion of the model /v1/models lists. Engines answer
    /health and /v1/models on deployments that cannot serve one request (vLLM on CPU with an unsupported
    head_dim, or after a worker node was lost): only a completion proves serving. Status 0: no answer."""
    try:
        models = http.get("/v1/models", 10.0)
        listed = models.json().get("data") if models.ok else None
        if not listed or not isinstance(listed, list) or not isinstance(listed[0], dict):
            return False, models.status, f"/v1/models lists no model (HTTP {models.status})"
        body = {"model": listed[0].get("id"), "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        reply = http.post("/v1/completions", body, timeout_s)
    except (ExecError, ValueError, AttributeError) as exc:
        return False, 0, f"/v1/completions: {str(exc).split(': ', 1)[-1]}"
    if not reply.ok:
        return False, reply.status, f"/v1/completions: HTTP {reply.status}: {reply.text[:300]}"
    try:
        choices = reply.json().get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not choices:
        return False, reply.status, f"/v1/completions answered without choices: {reply.text[:300]}"
    return True, reply.status, ""


def _why(exc: httpx.HTTPError) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc})"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return str(exc) or type(exc).__name__
