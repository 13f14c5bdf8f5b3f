"""The effort stage's load generator: streamed chat requests at a fixed concurrency (httpx AsyncClient), or,
when rank 0 is reachable only on its node (Ray), the same run made on the node by one python3 process; and the summary under the
field names of `vllm bench serve` result files (TPOT = (latency - TTFT) / (output tokens - 1), as vLLM)."""
from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from k3deploy.errors import ExecError
from k3deploy.validate.streamed import StreamRecord, add_event

if TYPE_CHECKING:
    import httpx

    from k3deploy.executors.http import NodeHttp

CHAT_PATH = "/v1/chat/completions"
ERRORS_SHOWN = 3


@dataclass(frozen=True)
class LoadRun:
    """Every request's record and the run's wall time."""

    records: list[StreamRecord]
    duration_s: float


Raw = tuple[list[tuple[float, bytes]], "str | None"]
OnReply = Callable[[str, Mapping[str, str]], None]


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout_s: float,
               on_reply: OnReply) -> Raw:
    """Stream one request, keeping each `data:` line with its arrival time (parsed after the run, so that
    parsing never delays reading the next chunk)."""
    import httpx

    events: list[tuple[float, bytes]] = []
    t0 = time.monotonic()
    try:
        async with client.stream("POST", url, json=body, timeout=timeout_s) as resp:
            on_reply(CHAT_PATH, resp.headers)
            if resp.status_code >= 300:
                await resp.aread()
                return events, f"HTTP {resp.status_code}: {resp.text[:200]}"
            rest = b""
            # Raw bytes split here (httpx's line decoder costs more than the chunk); every line of a read
            # arrived at that read's time.
            async for piece in resp.aiter_bytes():
                *lines, rest = (rest + piece).split(b"\n")
                now = time.monotonic() - t0
                events += [(now, line) for line in lines if line.startswith(b"data:")]
    except httpx.HTTPError as exc:
        return events, f"{type(exc).__name__}: {exc}"[:300]
    return events, None


def _record(events: Iterable[tuple[float, str]], error: str | None) -> StreamRecord:
    rec = StreamRecord()
    for t_s, data in events:
        add_event(rec, t_s, data)
    rec.error = error or rec.error
    if rec.error is None and rec.usage is None:
        rec.error = "the stream ended without a usage block"
    return rec


async def _run(url: str, bodies: Sequence[dict[str, Any]], concurrency: int, timeout_s: float,
               on_reply: OnReply) -> LoadRun:
    import httpx

    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    # Engines' URLs are private addresses: never through a proxy from the environment.
    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=timeout_s) as client:
        async def gated(body: dict[str, Any]) -> Raw:
            async with gate:
                return await _one(client, url, body, timeout_s, on_reply)

        t0 = time.monotonic()
        raw = await asyncio.gather(*(gated(b) for b in bodies))
        duration = time.monotonic() - t0
    return LoadRun([_record(((t, line[5:].strip().decode()) for t, line in events), error)
                    for events, error in raw], duration)


def run_load(url: str, bodies: Sequence[dict[str, Any]], concurrency: int, timeout_s: float,
             on_reply: OnReply | None = None) -> LoadRun:
    """Send every body to url, at most `concurrency` at a time, and wait for all (each reply's headers to
    `on_reply`: who served, through a router that says)."""
    return asyncio.run(_run(url, bodies, concurrency, timeout_s, on_reply or (lambda path, headers: None)))


def run_load_on_node(http: NodeHttp, bodies: Sequence[dict[str, Any]], concurrency: int,
                     timeout_s: float) -> LoadRun:
    """The whole run made on rank 0 by one python3 process (probes/load.py): its timings and its wall time."""
    from k3deploy.executors.fleet import probe_source
    from k3deploy.probes import load

    node = http.via
    if node is None:
        raise ValueError("run_load_on_node needs a NodeHttp made through a node's executor")
    argv = ["python3", "-c", probe_source(load), http.base_url + CHAT_PATH, f"{timeout_s:g}", str(concurrency),
            json.dumps(list(bodies))]
    res = node.run(argv, timeout_s * (len(bodies) // max(concurrency, 1) + 1) + 30.0)
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    result = lines[-1] if lines else {}
    if not res.ok or result.get("type") != "result" or "error" in result:
        why = result.get("error") or res.stderr.strip()[-300:] or f"exit {res.exit_code}"
        raise ExecError(f"the load run on the node failed: {why}", host=node.host)
    done = {line["i"]: line for line in lines if "i" in line}
    records = [_record(zip(done[i]["t"], done[i]["data"]), done[i]["error"]) if i in done
               else StreamRecord(error="no answer from the node for this request") for i in range(len(bodies))]
    return LoadRun(records, float(result["duration_s"]))


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stats(name: str, seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {f"mean_{name}_ms": statistics.fmean(ms) if ms else 0.0,
            f"median_{name}_ms": _pct(ms, 50), f"std_{name}_ms": statistics.pstdev(ms) if ms else 0.0,
            f"p90_{name}_ms": _pct(ms, 90), f"p99_{name}_ms": _pct(ms, 99)}


def summarize(run: LoadRun, gpus: int) -> dict[str, Any]:
    """The run's figures: vLLM bench names (duration, completed, ..._ttft_ms, ..._tpot_ms, ..._itl_ms,
    ..._e2el_ms, output_throughput) plus time to first answer token (ttfa), per-GPU output and shares."""
    ok = [r for r in run.records if r.error is None]
    out_tokens = [r.completion_tokens or 0 for r in ok]
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    reasoning = sum(r.reasoning_tokens or 0 for r in ok)
    cached = [r.cached_tokens for r in ok]
    tpot = [(r.latency_s - (r.ttft_s or 0)) / (n - 1) for r, n in zip(ok, out_tokens) if n > 1]
    duration = max(run.duration_s, 1e-9)
    total_out = sum(out_tokens)
    return {
        "duration": duration, "completed": len(ok), "failed": len(run.records) - len(ok),
        "total_input_tokens": in_tokens, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
        "total_token_throughput": (in_tokens + total_out) / duration,
        "output_throughput_per_gpu": total_out / duration / max(gpus, 1),
        **_stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]),
        **_stats("ttfa", [r.first_answer_s for r in ok if r.first_answer_s is not None]),
        "answered": sum(1 for r in ok if r.first_answer_s is not None),  # ttfa figures are of these only
        **_stats("tpot", tpot),
        **_stats("itl", [gap for r in ok for gap in r.itl_s]),
        **_stats("e2el", [r.latency_s for r in ok]),
        "reasoning_token_share": reasoning / total_out if total_out else 0.0,
        "cached_token_share": (sum(c for c in cached if c is not None) / in_tokens
                               if in_tokens and all(c is not None for c in cached) else None),
        "errors": [r.error for r in run.records if r.error is not None][:ERRORS_SHOWN],
    }
