"""Prefill/decode disaggregation's transfer, as SGLang 0.5.23 arranges it (disaggregation/common/conn.py).

The router sends the same request to a prefill and a decode server at once, adding bootstrap_host (the
prefill's host), bootstrap_port (given after `--prefill URL`) and a random bootstrap_room. The prefill runs a
bootstrap server on --disaggregation-bootstrap-port; the decode asks it `/route` for the prefill's parallel
info (once per bootstrap address, kept for later requests), then receives the room's KV and KDA state. The
stand-in's own transfer is plain HTTP on that server: `/k3sim/kv?room=R&skip=N` long-polls until the prefill
has published room R and answers the state past the decode's own cached prefix of N tokens. The state: the
prompt's token ids (the MLA KV) and the facts the KDA state carries (recall.Facts), so a decode restored from
a dropped or zeroed state answers wrongly.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from k3deploy.sim.faults import Faults
from k3deploy.sim.recall import Facts

BOOTSTRAP_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"  # a prefill waiting for its decode
WAITING_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"  # a decode waiting for the KV
DEFAULT_TIMEOUT_S = 300.0  # both timeouts' default in SGLang's environ
ROUTE_PATH = "/route"
ROUTE_QUERY = "engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"
KV_PATH = "/k3sim/kv"
ROUTE_TIMEOUT_S = 5.0  # requests.get(url, timeout=5) in SGLang's decode


class TransferError(Exception):
    """A KVTransferError as SGLang words it: the room and the reason."""

    def __init__(self, room: int | str, reason: str) -> None:
        super().__init__(f"KVTransferError(bootstrap_room={room}): {reason}")
        self.room = room
        self.reason = reason


@dataclass(frozen=True)
class Bootstrap:
    """Where the decode finds the prefilled state: the fields the router injects into the request."""

    host: str
    port: int
    room: int | str  # SGLang's bootstrap_room; vLLM's remote_request_id

    @property
    def addr(self) -> str:
        """host:port as SGLang writes bootstrap_addr."""
        return f"{self.host}:{self.port}"


def bootstrap_of(body: Any, default_port: int) -> Bootstrap | None:
    """The request's bootstrap fields (None: a request sent to the server directly, not by a PD router)."""
    if not isinstance(body, dict) or body.get("bootstrap_room") is None or not body.get("bootstrap_host"):
        return None
    port = body.get("bootstrap_port")
    # smg sends null for a prefill given without a port; the engine then uses its default port.
    return Bootstrap(str(body["bootstrap_host"]), int(port) if port is not None else default_port,
                     int(body["bootstrap_room"]))


def timeout_s(env: Mapping[str, str], name: str) -> float:
    """One of SGLang's disaggregation timeouts from the environment."""
    return float(env.get(name) or DEFAULT_TIMEOUT_S)


def prefilled_state(ids: list[int], facts: Facts, skip: int, faults: Faults) -> dict[str, Any]:
    """What the prefill sends for one room: the MLA KV past the decode's cached `skip` tokens, and the KDA
    state as it stands after the whole prompt (a recurrent state is one state, not cut at the decode's cached
    prefix: SGLang sends the request's state slot whole), which faults shape."""
    kda: dict[str, Any] | None = {"facts": [[k, v, p] for k, (v, p) in facts.items()]}
    if "transfer_kda_zeroed" in faults:
        kda = {"facts": [], "zeroed": True}
    elif "transfer_kda_dropped" in faults:
        kda = None
    return {"skip": skip, "token_ids": ids[skip:], "kda": kda}


def received_facts(state: dict[str, Any], ids: list[int], skip: int) -> Facts:
    """The facts the decode's KDA state holds after the transfer (none when the state is missing, zeroed, or
    belongs to other tokens)."""
    kda = state.get("kda")
    if state.get("skip") != skip or state.get("token_ids") != ids[skip:] or not isinstance(kda, dict):
        return {}
    return {str(k): (str(v), int(p)) for k, v, p in kda.get("facts", [])}


class Rooms:
    """Prefilled states by bootstrap room, each kept until its decode has read it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: dict[str, tuple[list[int], Facts]] = {}
        self._fetched: set[str] = set()

    def publish(self, room: str, ids: list[int], facts: Facts) -> None:
        """The prefill has computed the room's KV and KDA state."""
        with self._cond:
            self._ready[room] = (ids, facts)
            self._cond.notify_all()

    def take(self, room: str, wait_s: float) -> tuple[list[int], Facts] | None:
        """The room's state once published (None after wait_s)."""
        with self._cond:
            if not self._cond.wait_for(lambda: room in self._ready, timeout=wait_s):
                return None
            return self._ready[room]

    def done(self, room: str) -> None:
        """The decode has the room's state: the prefill may free it."""
        with self._cond:
            self._ready.pop(room, None)
            self._fetched.add(room)
            self._cond.notify_all()

    def wait_fetched(self, room: str, wait_s: float) -> bool:
        """Whether a decode read the room within wait_s (the room is freed either way)."""
        with self._cond:
            ok = self._cond.wait_for(lambda: room in self._fetched, timeout=wait_s)
            self._fetched.discard(room)
            self._ready.pop(room, None)
            return ok


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _BootstrapHttp

    def log_message(self, format: str, *args: Any) -> None:
        """aiohttp's access log is off in SGLang's bootstrap server."""

    def _send(self, status: int, data: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        """/health, /route (the prefill's parallel info) and the stand-in's KV transfer."""
        url = urlsplit(self.path)
        srv = self.server.owner
        if url.path == "/health":
            self._send(200, b"OK", "text/plain")
        elif url.path == ROUTE_PATH:
            self._send(200, json.dumps(srv.parallel_info).encode())
        elif url.path == KV_PATH:
            query = parse_qs(url.query)
            try:
                room, skip = query["room"][0], int(query.get("skip", ["0"])[0])
            except (KeyError, ValueError):
                self._send(400, b'{"error": "room is required and skip is an integer"}')
                return
            self._kv(srv, room, skip)
        else:
            self._send(404, b"Not Found", "text/plain")

    def _kv(self, srv: BootstrapServer, room: str, skip: int) -> None:
        got = srv.rooms.take(room, srv.wait_s)
        if got is None:
            self._send(404, json.dumps({"error": f"bootstrap_room {room} was not prefilled"}).encode())
            return
        data = json.dumps(prefilled_state(got[0], got[1], skip, srv.faults)).encode()
        if "prefill_dies_mid_transfer" in srv.faults and srv.count_transfer() > srv.faults.value(
                "prefill_dies_mid_transfer", 0):
            # Half the KV is on the wire when the prefill process dies: the decode sees a cut transfer.
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            os._exit(1)
        self._send(200, data)
        srv.rooms.done(room)


class _BootstrapHttp(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: BootstrapServer


class BootstrapServer:
    """The prefill's bootstrap server: SGLang's routes plus the stand-in's transfer of the room states."""

    def __init__(self, host: str, port: int, parallel_info: dict[str, Any], faults: Faults, wait_s: float) -> None:
        self.rooms = Rooms()
        self.parallel_info, self.faults, self.wait_s = parallel_info, faults, wait_s
        self._transfers, self._count_lock = 0, threading.Lock()
        self.httpd = _BootstrapHttp((host, port), _Handler)
        self.httpd.owner = self
        self.port = self.httpd.server_address[1]

    def count_transfer(self) -> int:
        """This transfer's number, from 1."""
        with self._count_lock:
            self._transfers += 1
            return self._transfers

    def start(self) -> None:
        """Serve in a daemon thread."""
        threading.Thread(target=self.httpd.serve_forever, name="k3sim-bootstrap", daemon=True).start()


def _get(url: str, wait_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=wait_s) as response:
        data: bytes = response.read()
        return data


# The decode's table of prefill parallel info by bootstrap_addr: SGLang asks a prefill's /route once and keeps
# the answer (kv_mgr.prefill_info_table, filled by try_ensure_parallel_info); a failed ask is not kept.
_PARALLEL_INFO: dict[str, dict[str, Any]] = {}
_PARALLEL_INFO_LOCK = threading.Lock()


def _parallel_info(boot: Bootstrap) -> dict[str, Any]:
    with _PARALLEL_INFO_LOCK:
        known = _PARALLEL_INFO.get(boot.addr)
    if known is not None:
        return known
    try:
        info = json.loads(_get(f"http://{boot.addr}{ROUTE_PATH}?{ROUTE_QUERY}", ROUTE_TIMEOUT_S))
    except (OSError, ValueError) as exc:
        raise TransferError(
            boot.room, f"Could not fetch prefill parallel info from bootstrap_addr: {boot.addr}"
        ) from exc
    if not isinstance(info, dict):
        raise TransferError(boot.room, f"Could not fetch prefill parallel info from bootstrap_addr: {boot.addr}")
    with _PARALLEL_INFO_LOCK:
        _PARALLEL_INFO[boot.addr] = info
    return info


def fetch_state(boot: Bootstrap, skip: int, wait_s: float, expect: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The decode's side: the prefill's parallel info (asked once per bootstrap address, as SGLang does; each
    `expect` key must match it), then the room's state (TransferError, worded as SGLang's)."""
    base = f"http://{boot.addr}"
    info = _parallel_info(boot)
    for key, wanted in (expect or {}).items():
        if info.get(key) != wanted:
            raise TransferError(boot.room, f"handshake with {boot.addr}: {key} is {info.get(key)!r}, expected {wanted!r}")
    started = time.monotonic()
    try:
        state = json.loads(_get(f"{base}{KV_PATH}?room={boot.room}&skip={skip}", wait_s + ROUTE_TIMEOUT_S))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise TransferError(
                boot.room, f"Request timed out after {time.monotonic() - started:.0f}s in KVPoll.WaitingForInput"
            ) from exc
        raise TransferError(boot.room, "Failed to get kvcache from prefill instance, it might be dead") from exc
    except (OSError, ValueError, http.client.HTTPException) as exc:  # a cut or refused transfer
        raise TransferError(boot.room, "Failed to get kvcache from prefill instance, it might be dead") from exc
    if not isinstance(state, dict):
        raise TransferError(boot.room, "Failed to get kvcache from prefill instance, it might be dead")
    return state
