"""TP 2 as two local processes with the flags `k3deploy render` gives a two-node topology (rank 0 serving, rank 1
`--headless`), nobody supervising: real vLLM, or the stand-in's vLLM mimic. Each pair is started, served one
completion, and is stopped leaving no process (and, for real vLLM, no scratch dir)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from k3deploy.sim.local_nodes import NodeSet, SimNode
from tests.polling import wait_for
from tests.ports import free_ports
from tests.realengine.checkpoints import CATALOG_DIR, LLAMA_ID, write_llama
from tests.realengine.server import RealVllm, group_alive, spawn_vllm, start_vllm, stop_vllm
from tests.realengine.venv import require_vllm

ROOT = Path(__file__).resolve().parents[2]


def rendered(tmp: Path, model_path: Path) -> tuple[list[list[str]], list[dict[str, str]]]:
    """Each node's argv and env, as `k3deploy render` gives them for TP 2 over two nodes."""
    port, master = free_ports(2)
    topo = {"name": "rt-healthpeer", "model": {"id": LLAMA_ID, "path": str(model_path), "revision": "seed-0"},
            "hardware": {"gpu": "cpu-host", "gpus_per_node": 1},
            "nodes": [{"host": "localhost", "ip": "127.0.0.1", "iface": "lo"},
                      {"host": "localhost", "ip": "127.0.0.2", "iface": "lo"}],
            "engine": {"kind": "vllm", "port": port, "version": "0.32.0", "args": {"--enforce-eager": True}},
            "parallel": {"tp": 2, "ep": 1},
            "serving": {"context_length": 2048, "max_running_requests": 4, "prefix_cache": True},
            "launch": {"executor": "local", "log_dir": str(tmp / "logs")}}
    path = tmp / "rt.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "k3deploy", "render", str(path), "--format", "json", "--catalog",
                          str(CATALOG_DIR)], capture_output=True, text=True, timeout=120, check=True, cwd=ROOT)
    nodes = json.loads(out.stdout)["nodes"]
    argvs = [list(n["argv"]) for n in nodes]
    for argv in argvs:  # the rendered default master port may be taken on a shared machine
        argv[argv.index("--master-port") + 1] = str(master)
    assert "--headless" in argvs[1] and "--headless" not in argvs[0], argvs
    return argvs, [dict(n["env"]) for n in nodes]


@contextmanager
def real_pair(tmp: Path, cache_root: Path) -> Iterator[tuple[RealVllm, RealVllm]]:
    """Real vLLM's head and headless node, once the head answered a completion; both stopped afterwards."""
    vllm = require_vllm()
    argvs, envs = rendered(tmp, write_llama(tmp / "llama"))
    headless = spawn_vllm([str(vllm), *argvs[1][1:]], envs[1], cache_root)
    head = None
    try:
        head = start_vllm([str(vllm), *argvs[0][1:]], LLAMA_ID, envs[0], cache_root=cache_root)
        print(f"real vLLM TP 2 (two processes) served after {head.ready_s:.0f} s")
        yield head, headless
    finally:
        for engine in (head, headless):
            if engine is not None:
                stop_vllm(engine)
                assert not group_alive(engine.proc.pid) and not engine.scratch.exists()


@contextmanager
def stand_in_pair(tmp: Path, env: Mapping[str, str] | None = None) -> Iterator[tuple[SimNode, SimNode, str]]:
    """The stand-in's head and headless node (with `env` added to both) and the head's URL, once the head
    answered a completion; both killed afterwards."""
    from k3deploy.sim.checkpoint import write_checkpoint

    k3tiny = tmp / "k3tiny"
    write_checkpoint(k3tiny)
    argvs, envs = rendered(tmp, k3tiny)
    url = f"http://127.0.0.1:{argvs[0][argvs[0].index('--port') + 1]}"
    body = {"model": LLAMA_ID, "prompt": "ready?", "max_tokens": 1, "temperature": 0}
    with NodeSet(tmp / "sim-logs") as nodes:
        for rank, (argv, node_env) in enumerate(zip(argvs, envs)):
            nodes.start(f"node{rank}", ["--mimic", "vllm", *argv[2:]], {**node_env, "K3SIM_GPU": "sim", **(env or {})})
        head, peer = nodes.nodes

        def served() -> bool:
            assert head.popen.poll() is None and peer.popen.poll() is None, head.text() + peer.text()
            try:
                return httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(served, 300, step_s=1.0), head.text()[-3000:]
        yield head, peer, url
        pids = [n.pid for n in nodes.nodes]
    assert wait_for(lambda: not any(group_alive(p) for p in pids), 60, step_s=0.2)
