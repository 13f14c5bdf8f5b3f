"""Time to first token and throughput through a real router against straight to one replica, in one run.

Usage: python bench/router.py [--routers smg,vllm-router] [--rounds R] [--requests N] [--concurrency C]
                              [--max-tokens T] [--speed S] [--quick]
For each router: two stand-in workers (the router's engine mimic: SGLang for smg, vLLM for vllm-router) and
the real router (the routers venv, started with the command k3deploy renders, cache_aware) in front of both.
Each round sends the same N streamed chat requests (distinct prompts, C at a time) straight to worker 0 and
then through the router, so both sides see the same load and the machine's drift lands on both; R rounds,
medians compared. Printed per router: mean TTFT and output tokens/s each way, their ratios, and the router's
overhead (TTFT through the router less straight). At C = 1 the router's second worker adds no capacity, so
the throughput ratio is the router's own cost; at C > 1 it also spreads load.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from k3deploy.engines.router import RouterSettings, router_argv
from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.local_nodes import NodeSet, free_ports
from k3deploy.validate.loadgen import CHAT_PATH, run_load, summarize

VENV = Path(os.environ.get("K3DEPLOY_ROUTERS_VENV") or Path.home() / ".cache" / "k3deploy" / "routers")
MIMIC = {"smg": "sglang", "sglang-router": "sglang", "vllm-router": "vllm"}
FLAGS = {"sglang": ["--context-length", "32768", "--served-model-name", "m"],
         "vllm": ["--max-model-len", "32768", "--enable-prefix-caching", "--served-model-name", "m"]}
READY_LINE = r"Starting vLLM server on|fired up and ready"


def _bodies(n: int, max_tokens: int, round_no: int, side: str) -> list[dict[str, Any]]:
    # Distinct per round and side: a prefix hit on a repeat would flatter whichever side came second.
    return [{"model": "m", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
             "messages": [{"role": "user", "content": f"{side} round {round_no} request {i}: " + "words " * 60}]}
            for i in range(n)]


def _wait_workers(url: str, expect: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            workers = httpx.get(f"{url}/workers", timeout=5).json().get("workers", [])
            if len(workers) == expect and all(w.get("is_healthy") for w in workers):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"the router at {url} never showed {expect} healthy workers")


def _bench_router(kind: str, args: argparse.Namespace, model: Path, logs: Path) -> dict[str, list[float]]:
    mimic = MIMIC[kind]
    w0, w1, port, metrics = free_ports(4)
    env = {"GLOO_SOCKET_IFNAME": "lo", "K3SIM_SPEED": f"{args.speed:g}"}
    figures: dict[str, list[float]] = {k: [] for k in ("ttft_direct", "ttft_router", "tps_direct", "tps_router")}
    with NodeSet(logs / kind) as ns:
        nodes = []
        for n, wport in enumerate((w0, w1)):
            ip = f"127.0.0.{51 + n}"
            host_env = {"SGLANG_HOST_IP" if mimic == "sglang" else "VLLM_HOST_IP": ip}
            nodes.append(ns.start(f"w{n}", ["--mimic", mimic, str(model), "--host", ip, "--port", str(wport),
                                            *FLAGS[mimic]], {**env, **host_env}))
        for node in nodes:
            node.wait_for(READY_LINE, 180)
        urls = (f"http://127.0.0.51:{w0}", f"http://127.0.0.52:{w1}")
        settings = RouterSettings(kind=kind, listen="127.0.0.1", port=port, worker_urls=urls, policy="cache_aware",
                                  health_failure_threshold=3, health_success_threshold=2, health_check_interval_s=5,
                                  health_check_timeout_s=60, startup_timeout_s=300, metrics_port=metrics)
        with (logs / f"{kind}-router.log").open("wb") as log:
            router = subprocess.Popen(router_argv(settings, str(VENV / "bin" / "python")), stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_workers(settings.url, 2, 180)
            for r in range(args.rounds):
                for side, base in (("direct", urls[0]), ("router", settings.url)):
                    run = run_load(base + CHAT_PATH, _bodies(args.requests, args.max_tokens, r, side),
                                   args.concurrency, 120)
                    s = summarize(run, 1)
                    if s["failed"]:
                        raise SystemExit(f"{kind} {side}: {s['failed']} requests failed: {s['errors']}")
                    figures[f"ttft_{side}"].append(s["mean_ttft_ms"])
                    figures[f"tps_{side}"].append(s["output_throughput"])
        finally:
            os.killpg(router.pid, signal.SIGTERM)
            try:
                router.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(router.pid, signal.SIGKILL)
                router.wait(timeout=10)
    return figures


def main() -> int:
    """Run every router's comparison and print the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default="smg,vllm-router")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--speed", type=float, default=4.0, help="the stand-in's K3SIM_SPEED")
    p.add_argument("--quick", action="store_true", help="2 rounds of 3 requests of 8 tokens")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.requests, args.max_tokens = 2, 3, 8
    if not (VENV / "bin" / "python").is_file():
        print(f"no routers venv at {VENV} (scripts/routers_venv.sh makes it)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="k3deploy-bench-router-") as tmp:
        model = Path(tmp) / "kimi-k3-tiny"
        write_checkpoint(model)
        print(f"{args.rounds} rounds x {args.requests} requests of {args.max_tokens} tokens, concurrency "
              f"{args.concurrency}, stand-in speed {args.speed:g}; medians over rounds")
        for kind in args.routers.split(","):
            f = _bench_router(kind, args, model, Path(tmp))
            med = {k: statistics.median(v) for k, v in f.items()}
            print(f"{kind} ({MIMIC[kind]} workers): TTFT straight {med['ttft_direct']:.1f} ms, through the router "
                  f"{med['ttft_router']:.1f} ms (x{med['ttft_router'] / max(med['ttft_direct'], 1e-9):.2f}); "
                  f"output straight {med['tps_direct']:.1f} tok/s, through the router {med['tps_router']:.1f} tok/s "
                  f"(x{med['tps_router'] / max(med['tps_direct'], 1e-9):.2f})")
            print(f"{kind} overhead: {med['ttft_router'] - med['ttft_direct']:+.1f} ms TTFT per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
