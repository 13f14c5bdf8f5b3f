"""`/health` while a peer is gone (issue 25's conformance item), real vLLM vs the stand-in's vLLM mimic.

Both sides run at once. Each runs TP 2 as two local processes with the flags `k3deploy render` gives a two-node topology: rank
0 serving, rank 1 `--headless`, nobody supervising. Once a completion answers, the headless node's process
group is SIGKILLed, and the head is watched (peer_watch): /health alone for IDLE_S, then /health and a
one-token completion every second. The stand-in must tell the same story (_story), answer the failed request
with the same body, and exit with the same status.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from k3deploy.sim.local_nodes import NodeSet, free_ports
from tests.polling import wait_for
from tests.realengine.checkpoints import CATALOG_DIR, LLAMA_ID, write_llama
from tests.realengine.peer_watch import Watch, watch
from tests.realengine.server import group_alive, spawn_vllm, start_vllm, stop_vllm
from tests.realengine.venv import require_vllm

pytestmark = [pytest.mark.timeout(1800), pytest.mark.torch]  # torch: the stand-in's nodes rendezvous over Gloo
ROOT = Path(__file__).resolve().parents[2]
IDLE_S = 20.0  # real vLLM notices nothing without traffic (real-engines.md: /health 200 for over 60 s)
WINDOW_S = 60.0
# No difference stays: the story, the error body and the exit status match. Timings are printed, not compared
# (a loaded 2-core machine); both heads exited within about 1.5 s of the failed completion.


def _rendered(tmp: Path, model_path: Path) -> tuple[list[list[str]], list[dict[str, str]]]:
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
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "k3deploy", "render", str(path), "--format", "json", "--catalog",
                          str(CATALOG_DIR)], capture_output=True, text=True, timeout=120, check=True, cwd=ROOT)
    nodes = json.loads(out.stdout)["nodes"]
    argvs = [list(n["argv"]) for n in nodes]
    for argv in argvs:  # the rendered default master port may be taken on a shared machine
        argv[argv.index("--master-port") + 1] = str(master)
    assert "--headless" in argvs[1] and "--headless" not in argvs[0], argvs
    return argvs, [dict(n["env"]) for n in nodes]


def _errors(log: str, most: int = 30) -> list[str]:
    """The log's error and warning lines (its last `most`)."""
    return [line for line in log.splitlines() if " ERROR " in line or " WARNING " in line][-most:]


def _real_watch(tmp: Path, cache_root: Path) -> Watch:
    vllm = require_vllm()
    argvs, envs = _rendered(tmp, write_llama(tmp / "llama"))
    headless = spawn_vllm([str(vllm), *argvs[1][1:]], envs[1], cache_root)
    head = None
    try:
        head = start_vllm([str(vllm), *argvs[0][1:]], LLAMA_ID, envs[0], cache_root=cache_root)
        print(f"real vLLM TP 2 (two processes) served after {head.ready_s:.0f} s")
        os.killpg(headless.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        headless.proc.wait(timeout=60)
        seen = watch(head.url, LLAMA_ID, killed_at, head.proc.poll, IDLE_S, WINDOW_S)
        print(f"real vLLM, headless peer killed: {seen.summary()}")
        print(f"real vLLM's failed completion: {seen.failure_body}")
        print("real vLLM head's errors:\n" + "\n".join(_errors(head.log())))
        return seen
    finally:
        for engine in (head, headless):
            if engine is not None:
                stop_vllm(engine)
                assert not group_alive(engine.proc.pid) and not engine.scratch.exists()


def _stand_in_watch(tmp: Path) -> Watch:
    from k3deploy.sim.checkpoint import write_checkpoint

    k3tiny = tmp / "k3tiny"
    write_checkpoint(k3tiny)
    argvs, envs = _rendered(tmp, k3tiny)
    url = f"http://127.0.0.1:{argvs[0][argvs[0].index('--port') + 1]}"
    body = {"model": LLAMA_ID, "prompt": "ready?", "max_tokens": 1, "temperature": 0}
    with NodeSet(tmp / "sim-logs") as nodes:
        for rank, (argv, env) in enumerate(zip(argvs, envs)):
            nodes.start(f"node{rank}", ["--mimic", "vllm", *argv[2:]], {**env, "K3SIM_GPU": "sim"})
        head, peer = nodes.nodes

        def served() -> bool:
            assert head.popen.poll() is None and peer.popen.poll() is None, head.text() + peer.text()
            try:
                return httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(served, 300, step_s=1.0), head.text()[-3000:]
        peer.kill(signal.SIGKILL)
        killed_at = time.monotonic()
        seen = watch(url, LLAMA_ID, killed_at, head.popen.poll, IDLE_S, WINDOW_S)
        print(f"stand-in, headless peer killed: {seen.summary()}")
        print(f"stand-in's failed completion: {seen.failure_body}")
        print("stand-in head's errors:\n" + "\n".join(_errors(head.text())))
        pids = [n.pid for n in nodes.nodes]
    assert wait_for(lambda: not any(group_alive(p) for p in pids), 60, step_s=0.2)
    return seen


def _story(seen: Watch) -> dict[str, object]:
    """What a supervisor or validate could learn from the head, without the timings."""
    idle = {s.health for s in seen.samples if s.completion is None}
    first = seen.first(lambda s: s.completion is not None)
    failed = seen.first(lambda s: s.completion not in (None, "200"))
    after = [s for s in seen.samples if failed and s.t_s > failed.t_s]
    return {"idle /health": idle, "first completion": first.completion if first else None,
            "/health with the first completion": first.health if first else None,
            "head exits after the failed completion": seen.head_exit_s is not None and failed is not None
            and seen.head_exit_s >= failed.t_s,
            "answers once gone": {s.health for s in after[-1:]}, "head's exit status": seen.head_status,
            "failed completion's error": _error(seen.failure_body)}


def _error(body: str | None) -> object:
    """The error's type, message and code (vLLM's JSON envelope)."""
    if body is None:
        return None
    error = json.loads(body)["error"]
    return error["type"], error["message"], error["code"]


def test_health_while_the_headless_peer_is_gone(tmp_path: Path, vllm_cache_root: Path) -> None:
    require_vllm()  # skip before starting anything
    # The two sides at once (own ports, own dirs): the stand-in's start and watch fit inside real vLLM's start.
    with ThreadPoolExecutor(1) as pool:
        stand_in = pool.submit(_stand_in_watch, tmp_path / "sim")
        real = _real_watch(tmp_path / "real", vllm_cache_root)  # on an error, `with` waits for the stand-in
        sim = stand_in.result(timeout=900)  # its own waits are bounded; this keeps the test bounded too
    print(f"stories:\n  real vLLM {_story(real)}\n  stand-in  {_story(sim)}")
    # Real vLLM notices nothing without traffic: /health stays 200 while it cannot serve.
    assert _story(real)["idle /health"] == {"200"} and _story(real)["first completion"] == "500", real.summary()
    assert _story(sim) == _story(real), (real.summary(), sim.summary())
