"""The stand-in engine's pacing against its own performance model, over HTTP, in one run.

Usage: python bench/sim_pacing.py [--speed S] [--quick] [--gpu ID]
Starts one SGLang-mimic stand-in (tiny checkpoint, prefix cache, cache report), then prints:
  1. time to first token for prompts of rising length (it should rise: prefill grows with the prompt);
  2. the same long prompt again (a prefix hit: it should fall, with cached_tokens reported);
  3. inter-token latency of one stream against the model's step time (target: within 10%);
  4. inter-token latency with 1, 2, 4, 8 concurrent streams (it should grow with the batch).
Model figures come from the server's /server_info (k3sim_pacing); measured figures are means over tokens.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.local_nodes import NodeSet, free_ports

# One client for the run: a new httpx client builds an SSL context, which would count in every TTFT.
CLIENT = httpx.Client(limits=httpx.Limits(max_connections=16))


def stream(url: str, words: int, max_tokens: int, salt: str) -> dict[str, Any]:
    """One streamed chat request: TTFT, the gaps between token chunks, and the final usage."""
    text = salt + " " + " ".join(f"w{i % 97}" for i in range(words))
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    with CLIENT.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and any(v for k, v in chunk["choices"][0]["delta"].items() if k != "role"):
                stamps.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {"ttft_s": stamps[0] - started, "gaps": gaps, "usage": usage}


def model_step(pacing: dict[str, float], context: float) -> float:
    """The model's decode step at batch 1 for a request holding `context` tokens."""
    return pacing["decode_step_s_batch1"] + pacing["decode_step_s_per_context_token"] * context


def run(url: str, quick: bool) -> None:
    info = httpx.get(f"{url}/server_info", timeout=30).json()
    pacing = info["k3sim_pacing"]
    print(
        f"stand-in: {info['k3sim_gpu']}, speed {pacing['speed']:g}; model: decode step (batch 1) "
        f"{pacing['decode_step_s_batch1'] * 1e3:.2f} ms, prefill {pacing['prefill_s_per_token'] * 1e6:.1f} us/token"
    )
    lengths = (256, 1024, 2048) if quick else (512, 2048, 8192)
    print("\n1. time to first token by prompt length (fresh prompts, no prefix hit)")
    ttfts = []
    for words in lengths:
        r = stream(url, words, 2, uuid.uuid4().hex)
        ttfts.append(r["ttft_s"])
        model = pacing["prefill_s_per_token"] * r["usage"]["prompt_tokens"]
        print(
            f"   {r['usage']['prompt_tokens']:6d} tokens: TTFT {r['ttft_s'] * 1e3:8.1f} ms  (model prefill {model * 1e3:.1f} ms)"
        )
    print(f"   rising with prompt length: {'yes' if ttfts == sorted(ttfts) else 'NO'}")

    print("\n2. the longest prompt again (prefix hit)")
    salt = uuid.uuid4().hex
    cold, warm = stream(url, lengths[-1], 2, salt), stream(url, lengths[-1], 2, salt)
    cached = (warm["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
    print(
        f"   cold TTFT {cold['ttft_s'] * 1e3:.1f} ms; warm TTFT {warm['ttft_s'] * 1e3:.1f} ms with "
        f"{cached} of {warm['usage']['prompt_tokens']} tokens cached"
    )
    print(f"   falling on a prefix hit: {'yes' if warm['ttft_s'] < cold['ttft_s'] else 'NO'}")

    tokens = 60 if quick else 200
    print(f"\n3. inter-token latency of one stream ({tokens} tokens) against the model's step")
    r = stream(url, 64, tokens, uuid.uuid4().hex)
    measured = statistics.mean(r["gaps"])
    model = model_step(pacing, r["usage"]["prompt_tokens"] + tokens / 2)
    off = measured / model - 1
    print(
        f"   measured {measured * 1e3:.3f} ms, model {model * 1e3:.3f} ms, off by {off:+.1%} "
        f"(within 10%: {'yes' if abs(off) <= 0.10 else 'NO'})"
    )

    print("\n4. inter-token latency by concurrency (streams started together)")
    means = []
    for batch in (1, 4) if quick else (1, 2, 4, 8):
        results: list[dict[str, Any]] = []

        def one(out: list[dict[str, Any]] = results) -> None:
            out.append(stream(url, 64, tokens, uuid.uuid4().hex))

        threads = [threading.Thread(target=one) for _ in range(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        mean = statistics.mean(g for res in results for g in res["gaps"])
        means.append(mean)
        print(f"   {batch} streams: mean ITL {mean * 1e3:.3f} ms ({mean / means[0]:.2f}x batch 1)")
    print(
        f"   growing with concurrency: {'yes' if means == sorted(means) and means[-1] > means[0] else 'NO'}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", default="1", help="K3SIM_SPEED for the stand-in (default 1)")
    ap.add_argument("--quick", action="store_true", help="shorter prompts and streams (the test runs this)")
    ap.add_argument("--gpu", default="sim", help="hardware catalog id the stand-in pretends to be")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k3sim-bench-") as tmp:
        model = Path(tmp) / "kimi-k3-tiny"
        write_checkpoint(model, shards=1)
        (port,) = free_ports(1)
        argv = ["--mimic", "sglang", str(model), "--host", "127.0.0.1", "--port", str(port),
                "--context-length", "32768", "--enable-cache-report", "--served-model-name", "m"]  # fmt: skip
        env = {"K3SIM_SPEED": args.speed, "K3SIM_GPU": args.gpu, "GLOO_SOCKET_IFNAME": "lo",
               "SGLANG_HOST_IP": "127.0.0.1"}  # fmt: skip
        with NodeSet(Path(tmp) / "logs") as nodes:
            node = nodes.start("sglang", argv, env)
            node.wait_for(r"fired up and ready", 120)
            run(f"http://127.0.0.1:{port}", args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
