"""Helpers shared by the launch tests (no tests here): a fake engine, topologies for it, leak checks."""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from k3deploy.executors.base import TAG_VAR
from k3deploy.launch.ipc import ipc_dir
from tests.ports import free_port

# A stand-in for the stand-in: starts in milliseconds. Rank 0 serves /health, /v1/models and completions on
# SGLANG_HOST_IP:--port; behaviour knobs come from engine.env (FAKE_*), exported on every node.
FAKE_ENGINE = r'''
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
rank = int(opt("--node-rank", "0")); port = int(opt("--port"))
host = os.environ.get("SGLANG_HOST_IP", "127.0.0.1")
print(f"fake engine rank {rank} up", flush=True)
import socket, tempfile, uuid
ipc = []  # as vLLM binds its ZMQ IPC sockets: $VLLM_RPC_BASE_PATH/<uuid4>, never unlinked when killed
for _ in range(int(os.environ.get("FAKE_IPC_SOCKETS", "0"))):
    ipc.append(socket.socket(socket.AF_UNIX))
    ipc[-1].bind(os.path.join(os.environ.get("VLLM_RPC_BASE_PATH", tempfile.gettempdir()), str(uuid.uuid4())))
if os.environ.get("FAKE_EXIT_RANK") == str(rank):
    time.sleep(float(os.environ.get("FAKE_EXIT_AFTER_S", "0.3")))
    print(os.environ.get("FAKE_EXIT_LINE", "fake engine: worker crashed"), flush=True)
    sys.exit(int(os.environ.get("FAKE_EXIT_STATUS", "3")))
if os.environ.get("FAKE_HANG_RANK") == str(rank):
    print(os.environ["FAKE_HANG_LINE"], flush=True)
if os.environ.get("FAKE_FATAL_RANK") == str(rank):
    print("RuntimeError: [enforce fail at gloo] Unable to find address for: ens-bogus", flush=True)
    time.sleep(3600)
time.sleep(float(os.environ.get("FAKE_READY_DELAY_S", "0")))
if rank == 0 and os.environ.get("FAKE_NEVER_READY") != "1":
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
            self.end_headers()
            self.wfile.write(json.dumps({"data": [{"id": "kimi-k3-tiny"}]}).encode())
        def do_POST(self):  # launch's readiness ends with a one-token completion
            self.rfile.read(int(self.headers.get("content-length") or 0))
            code = int(os.environ.get("FAKE_COMPLETION_STATUS", "200")) if self.path == "/v1/completions" else 404
            self.send_response(code)
            self.end_headers()
            body = {"choices": [{"text": "x"}]} if code == 200 else {"error": {"message": "EngineCore died"}}
            self.wfile.write(json.dumps(body).encode())
        def log_message(self, *a):
            pass
    ThreadingHTTPServer((host, port), H).serve_forever()
for _ in range(36000):
    time.sleep(0.1)
'''


def fake_topology(tmp: Path, name: str, *, nodes: int = 4, env: dict[str, str] | None = None,
                  launch: dict[str, Any] | None = None, **top: Any) -> Path:
    """A feasible local topology whose engine is FAKE_ENGINE; state and logs under `tmp`."""
    engine_py = tmp / "fake_engine.py"
    engine_py.write_text(FAKE_ENGINE)
    doc: dict[str, Any] = {
        "name": name,
        "model": {"id": "kimi-k3-tiny", "path": str(tmp / "ckpt")},
        "hardware": {"gpu": "sim", "gpus_per_node": 1},
        "nodes": [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(nodes)],
        "engine": {"kind": "sim", "mimic": "sglang", "port": free_port(),
                   "launcher": [sys.executable, str(engine_py)], "env": env or {}},
        "parallel": {"tp": nodes, "ep": nodes},
        "serving": {"context_length": 32768, "max_running_requests": 16},
        "launch": {"executor": "local", "port": free_port(), "dist_timeout_s": 20, "ready_timeout_s": 20,
                   "stop_grace_s": 2, "log_dir": str(tmp / "logs"), "state_dir": str(tmp / "state"),
                   **(launch or {})},
        **top,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def tagged_pids(prefix: str) -> list[int]:
    """Live local processes whose K3DEPLOY_RUN starts with `prefix` (a deployment's processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(e.startswith(f"{TAG_VAR}={prefix}".encode()) for e in env):
            found.append(int(entry))
    return found


def kill_tagged(prefix: str) -> list[int]:
    """SIGKILL whatever a test left running (returns what it found)."""
    left = tagged_pids(prefix)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def stop_left(dep_name: str, state_dir: Path) -> tuple[bool, list[int]]:
    """Stop the deployment's supervisor (from its record) and SIGKILL its tagged processes: (a supervisor
    was running, the pids found)."""
    from k3deploy.records.store import StateStore

    store = StateStore(state_dir)
    rec = store.load(dep_name) if store.path(dep_name).is_file() else None
    owner = rec.owner if rec is not None else None
    owner_alive = owner is not None and owner.alive()
    if owner is not None and owner_alive:
        owner.terminate(2)
    left = kill_tagged(f"{dep_name}.")
    # What `stop` would have removed with the nodes: their IPC directories (local nodes share this /tmp).
    for node in rec.nodes if rec is not None else []:
        if node.handle is not None:
            shutil.rmtree(ipc_dir(node.handle.tag), ignore_errors=True)
    return owner_alive, left


def assert_nothing_left(dep_name: str, state_dir: Path) -> None:
    """After a test: stop and count (in the reliability figures) any supervisor or node process of the
    deployment still running, then fail if there was one."""
    from tests import figures

    owner_alive, left = stop_left(dep_name, state_dir)
    figures.add(figures.NODES_LEFT, len(left) + owner_alive)
    assert not owner_alive, "a supervisor was left running"
    assert left == [], f"processes left running: {left}"


def assert_supervisor_stopped_group(log: Path, failed_rank: int, survivors: list[int]) -> None:
    """The supervisor's log, in order: rank `failed_rank` failed, then every survivor stopping and stopped by
    it, then its exit: supervision, not the nodes' own end, stopped the group (an ordering, not a time)."""
    lines = [line.split(" ", 1)[1] for line in log.read_text().splitlines() if " " in line]

    def at(match: str, start: int = 0) -> int:
        found = [i for i, line in enumerate(lines) if i >= start and re.fullmatch(match, line)]
        assert found, f"no line {match!r} after line {start} of {log}:\n" + "\n".join(lines)
        return found[0]

    failed = at(rf"group: failed rank {failed_rank} \(.*")
    end = at(r"supervisor exits; deployment failed", failed)
    for rank in survivors:
        stopping = at(rf"rank {rank} \S+: stopping", failed)
        assert stopping < at(rf"rank {rank} \S+: stopped", stopping) < end, "\n".join(lines)
