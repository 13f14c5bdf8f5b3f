"""The effort stage's load generator (k3deploy.validate.loadgen) against a trivial streaming server, in one run.

Usage: python bench/loadgen.py [--requests N] [--chunks N] [--concurrency C] [--rounds R]
A server in its own process answers every POST with N OpenAI chat chunks (one token each) and a usage chunk,
written as fast as the socket takes them. The same requests are then sent twice at the same concurrency:
  1. a plain client loop: C threads, each a blocking http.client connection reading line by line and
     parsing each chunk's JSON;
  2. the load generator (httpx AsyncClient, every chunk parsed into a record with its arrival time);
R rounds of both, interleaved; the medians are compared.
Targets: the load generator's sustained chunks/s within 1.25x of the plain loop's, and at least 10x what
the effort stage needs at default settings (validate.concurrency 8 streams at a fast K3 decode, TPOT 5 ms:
1,600 chunks/s).
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from k3deploy.topology.settings import ValidateSettings
from k3deploy.validate.loadgen import run_load

FAST_TPOT_S = 0.005  # a fast K3 decode step: the most one stream can ask of the client
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}


def _payload(chunks: int) -> bytes:
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [{**head, "choices": [{"index": 0, "delta": {"reasoning_content" if i < chunks // 2 else "content":
                                                              f" tok{i}"}, "finish_reason": None}]}
              for i in range(chunks)]
    events.append({**head, "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": chunks}})
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def serve(port: int, chunks: int) -> None:
    """Serve the same stream to every POST until killed."""
    payload = _payload(chunks)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()


def plain_loop(port: int, requests: int, concurrency: int) -> tuple[int, float]:
    """(data lines read, seconds): C threads, each a kept-alive http.client connection."""
    body = json.dumps(BODY).encode()
    share = [requests // concurrency + (1 if i < requests % concurrency else 0) for i in range(concurrency)]
    lock, total = threading.Lock(), [0]

    def worker(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        seen = 0
        for _ in range(n):
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            for line in resp:  # line by line as it streams, each chunk parsed: the work the generator does
                if line.startswith(b"data: {"):
                    json.loads(line[6:])
                    seen += 1
            resp.read()  # the end of the body (keeps the connection reusable)
        conn.close()
        with lock:
            total[0] += seen

    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, share))
    return total[0], time.monotonic() - t0


def main() -> int:
    """Run both clients against one server and print the comparison; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=ValidateSettings().concurrency)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.chunks)
        return 0
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--chunks", str(args.chunks)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        plain_rates, gen_rates, errors = [], [], []
        for _ in range(args.rounds):  # interleaved, medians compared: a shared machine's load hits both alike
            plain_lines, plain_s = plain_loop(port, args.requests, args.concurrency)
            run = run_load(f"http://127.0.0.1:{port}/v1/chat/completions", [BODY] * args.requests,
                           args.concurrency, 60)
            plain_rates.append(plain_lines / plain_s)
            gen_rates.append(sum(len(r.deltas) for r in run.records) / run.duration_s)
            errors += [r.error for r in run.records if r.error]
    finally:
        server.terminate()
        server.wait(10)
    plain_rate, gen_rate = statistics.median(plain_rates), statistics.median(gen_rates)
    needed = args.concurrency / FAST_TPOT_S
    ratio = plain_rate / gen_rate
    print(f"requests {args.requests} x {args.chunks} chunks at concurrency {args.concurrency}")
    print(f"plain client loop : {plain_rate:12,.0f} data lines/s (median of {args.rounds}: "
          f"{', '.join(f'{r:,.0f}' for r in plain_rates)})")
    print(f"load generator    : {gen_rate:12,.0f} token chunks/s (median of {args.rounds}: "
          f"{', '.join(f'{r:,.0f}' for r in gen_rates)}; {len(errors)} errors)")
    print(f"plain / generator : {ratio:.2f}x (target <= 1.25x)")
    print(f"effort stage needs: {needed:12,.0f} chunks/s at defaults; generator gives {gen_rate / needed:.1f}x "
          f"(target >= 10x)")
    return 0 if ratio <= 1.25 and gen_rate >= 10 * needed and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
