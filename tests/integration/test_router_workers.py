"""Each real router (the routers venv) in front of two stand-in workers: it registers both and reports them
healthy in `GET /workers`, routes requests to both (round_robin), and the cache-aware policy keeps a conversation's
second turn on the worker that served its first. Each worker's access log says what the router asked of it.

What the routers were seen to ask (smg 1.13.0, sglang-router 0.3.2 of SGLang workers; vllm-router 0.1.17 of
vLLM workers), all of which the stand-in answers as its engine does:
- smg / sglang-router at registration: GET /health, /v1/models, /server_info then /get_server_info,
  /model_info then /get_model_info, /metrics; the load monitor: GET /v1/loads?include=... and /loads?model=
  (404 from the stand-in: the router carries on without load figures); health checks: GET /health.
- vllm-router at registration: GET /health, /v1/models, /get_server_info, /get_model_info (404 on vLLM);
  for every chat request: POST /v1/chat/completions/render (vLLM 0.32 answers 403 without
  --enable-scale-out) and then POST /tokenize on every worker; health checks: GET /health.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from k3deploy.engines.router import RouterSettings, router_argv
from k3deploy.sim.local_nodes import NodeSet, SimNode
from tests.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
VENV = Path(os.environ.get("K3DEPLOY_ROUTERS_VENV") or Path.home() / ".cache" / "k3deploy" / "routers")
READY = VENV / ".k3deploy-routers-ready"
needs_routers = pytest.mark.skipif(not READY.is_file(), reason=f"no routers venv at {VENV} "
                                   "(scripts/test.sh makes it with scripts/routers_venv.sh)")
FLAGS = {"sglang": ["--context-length", "32768", "--served-model-name", "m", "--enable-metrics"],
         "vllm": ["--max-model-len", "32768", "--enable-prefix-caching", "--served-model-name", "m"]}
# Seen: with cache_aware and one request at a time (no load), sglang-router 0.3.2 and vllm-router 0.1.17 sent
# every distinct conversation to the same worker (chat and completions alike), smg 1.13.0 spread them over
# both in 2 runs of 3: the policy spreads by load, so spreading is not asserted here.
READY_LINE = r"Starting vLLM server on|fired up and ready"
CHAT = re.compile(r'"POST /v1/chat/completions HTTP/1.1" 200')


def _chats(node: SimNode) -> int:
    return len(CHAT.findall(node.text()))


def _served_by(nodes: list[SimNode], before: list[int], timeout_s: float = 30) -> int:
    """The worker whose access log gained the one chat request sent since `before` was counted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        grew = [i for i, n in enumerate(nodes) if _chats(n) > before[i]]
        if grew:
            assert len(grew) == 1, f"one request, served by workers {grew}"
            return grew[0]
        time.sleep(0.1)
    raise AssertionError("no worker logged the request")


def _wait_healthy(url: str, expect: int, timeout_s: float = 180) -> list[dict[str, object]]:
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/workers", timeout=5)
            workers = r.json().get("workers", []) if r.status_code == 200 else []
            last = r.text[:400]
            if len(workers) == expect and all(w.get("is_healthy") for w in workers):
                return list(workers)
        except (httpx.HTTPError, ValueError) as exc:
            last = str(exc)
        time.sleep(0.5)
    raise AssertionError(f"router never showed {expect} healthy workers: {last}")


@pytest.fixture(params=[(k, m, p) for k, m in (("smg", "sglang"), ("sglang-router", "sglang"),
                                               ("vllm-router", "vllm")) for p in ("cache_aware", "round_robin")],
                ids=lambda p: f"{p[0]}-{p[2]}")
def routed(request: pytest.FixtureRequest, checkpoint: Path, tmp_path: Path) -> Iterator[tuple[str, str, list[str], list[SimNode]]]:
    kind, mimic, policy = request.param
    w0, w1, port, metrics = free_ports(4)
    env = {"GLOO_SOCKET_IFNAME": "lo", "K3SIM_SPEED": "20"}
    with NodeSet(tmp_path / "logs") as ns:
        nodes = []
        for n, wport in enumerate((w0, w1)):
            ip = f"127.0.0.{41 + n}"
            host_env = {"SGLANG_HOST_IP" if mimic == "sglang" else "VLLM_HOST_IP": ip}
            nodes.append(ns.start(f"w{n}", ["--mimic", mimic, str(checkpoint), "--host", ip, "--port", str(wport),
                                            *FLAGS[mimic]], {**env, **host_env}))
        for node in nodes:
            node.wait_for(READY_LINE, 120)
        worker_urls = [f"http://127.0.0.41:{w0}", f"http://127.0.0.42:{w1}"]
        # The command k3deploy renders (its own metrics port: the routers' default 0.0.0.0:29000 collides).
        settings = RouterSettings(kind=kind, listen="127.0.0.1", port=port, worker_urls=tuple(worker_urls),
                                  policy=policy, health_failure_threshold=3, health_success_threshold=2,
                                  health_check_interval_s=2, health_check_timeout_s=60, startup_timeout_s=300,
                                  metrics_port=metrics)
        argv = router_argv(settings, str(VENV / "bin" / "python"))
        with (tmp_path / "router.log").open("wb") as log:
            router = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        try:
            yield policy, f"http://127.0.0.1:{port}", worker_urls, nodes
        finally:
            os.killpg(router.pid, signal.SIGTERM)
            try:
                router.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(router.pid, signal.SIGKILL)
                router.wait(timeout=10)


@needs_routers
def test_real_router_registers_both_workers_routes_to_both_and_keeps_a_conversation_on_one(
        routed: tuple[str, str, list[str], list[SimNode]]) -> None:
    policy, url, worker_urls, nodes = routed
    workers = _wait_healthy(url, 2)
    assert sorted(str(w["url"]) for w in workers) == sorted(worker_urls)
    served: dict[int, list[int]] = {}
    with httpx.Client(timeout=60) as client:
        for turn in (1, 2):
            for conv in range(6):
                # Long distinct openings: each conversation's prefix is its own, well above the cache threshold.
                messages = [{"role": "user", "content": f"Conversation {conv}: " + f"topic {conv} " * 80}]
                if turn == 2:
                    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "and?"}]
                before = [_chats(n) for n in nodes]
                r = client.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages,
                                                                      "max_tokens": 4})
                assert r.status_code == 200, r.text
                served.setdefault(conv, []).append(_served_by(nodes, before))
    if policy == "cache_aware":
        assert all(s[0] == s[1] for s in served.values()), f"a second turn moved worker: {served}"
    else:  # round_robin: every worker serves, each in turn
        assert {s[0] for s in served.values()} == {0, 1}, f"requests did not reach both workers: {served}"
