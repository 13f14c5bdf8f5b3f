"""The engine core behind the API: running slots, the prefix cache, paced tokens, metrics and usage.

A request waits for one of max_running_requests slots, looks its prompt up in the prefix cache (the hit
is the cached part, never the whole prompt), then takes its tokens from the shared accelerator as the
performance model releases them. When it ends, finished or cut off by a client that went away, its prompt
and output go into the prefix cache and the metrics.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

from k3deploy.catalog.specs import VisionSpec
from k3deploy.sim.admission import Admission
from k3deploy.sim.faults import Faults
from k3deploy.sim.generation import Completion, Piece
from k3deploy.sim.log_format import EngineLog
from k3deploy.sim.metrics import EngineMetrics, ServingStats
from k3deploy.sim.pacing import Gpu, PerfModel
from k3deploy.sim.peer_loss import LostPeer
from k3deploy.sim.prefix_cache import PrefixCache
from k3deploy.sim.serve_config import ServeConfig
from k3deploy.sim.tokens import token_ids

State = Literal["starting", "ready", "stalled", "peer_lost", "dead"]
HASH_BLOCK_TOKENS = 512  # K3's documented fine hash block; 12 of them make one physical block
PHYSICAL_BLOCKS_PER_PAGE = 12
# A head stuck in a collective never answers; the stand-in gives up after this long so tests end.
STALL_S = 600.0


@dataclass
class Job:
    """One request on its way through the engine."""

    ids: list[int]
    boundaries: list[int]
    done: Completion
    started: float = field(default_factory=time.monotonic)
    cached: int = 0
    generated: int = 0
    # Set when a prefix hit changes what is generated (a wrongly restored state): the completion for a hit.
    rehit: Callable[[int], Completion] | None = None
    salt: str = ""  # vLLM's cache_salt: hits only blocks cached under the same salt
    transferred: int = 0  # prompt tokens whose KV a prefill server computed and sent (PD decode)
    # A vLLM PD decode reports the prefill's hit, not its own (~100%, the transfer): vLLM 0.32.0's scheduler
    # puts it in kv_transfer_params as remote_prefill_cached_tokens (v1/engine/output_processor.py).
    reported_hit: int | None = None


class EngineCore:
    """Shared by every request thread (the HTTP server runs one thread per connection)."""

    def __init__(
        self,
        cfg: ServeConfig,
        admission: Admission,
        log: EngineLog,
        perf: PerfModel | None = None,
        faults: Faults | None = None,
        vision: VisionSpec | None = None,
    ) -> None:
        self.cfg = cfg
        self.vision = vision  # the model's image processor (None: text only)
        self.faults = faults or Faults()
        self.admission = admission
        self.log = log
        self.state: State = "starting"
        self.lost_peer: LostPeer | None = None  # set with state "peer_lost"
        self.on_death: Callable[[], None] = lambda: None  # the process's own reaction (vLLM: shut down)
        block = cfg.prefix_match_unit or HASH_BLOCK_TOKENS
        self.cache: PrefixCache[None] = PrefixCache(
            hash_block_tokens=block,
            physical_block_tokens=block * PHYSICAL_BLOCKS_PER_PAGE,
            capacity_tokens=max(admission.budget.kv_tokens, block * PHYSICAL_BLOCKS_PER_PAGE),
            enabled=cfg.prefix_cache,
        )
        self.stats = ServingStats(
            kv_total_tokens=max(admission.budget.kv_tokens, 1),
            state_slots_total=max(admission.budget.state_requests, 1),
        )
        self.metrics = EngineMetrics(cfg.mimic, cfg.served_model_name, self.stats)
        self.gpu = Gpu(perf)  # no model: tokens come out as fast as they are asked for
        self._cond = threading.Condition()
        self._never = threading.Event()
        self._serial = 0

    def _head(self, prefix: str, body: dict[str, Any]) -> dict[str, Any]:
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:24]
        with self._cond:
            self._serial += 1
            serial = self._serial
        return {
            "id": f"{prefix}-{digest}{serial:04x}",
            "created": int(time.time()),
            "model": self.cfg.served_model_name,
        }

    def usage(self, job: Job, *, brief: bool = False, chat: bool = True, stream: bool = False) -> dict[str, Any]:
        """Token counts so far (brief: vLLM's continuous usage, the three totals only)."""
        n, g = len(job.ids), job.generated
        totals: dict[str, Any] = {"prompt_tokens": n, "completion_tokens": g, "total_tokens": n + g}
        if brief:
            return totals
        reasoning = sum(1 for p in job.done.pieces[:g] if p.kind in ("think", "reasoning"))
        # vLLM counts reasoning tokens only in chat and only with a reasoning parser
        # (chat_completion/serving.py: `_include_reasoning_tokens_details = bool(reasoning_parser)`); else null.
        details = self.cfg.mimic != "vllm" or (chat and bool(self.cfg.reasoning_parser))
        if not details and stream:  # a stream's usage chunk leaves the unset field out; a whole reply has null
            return {**totals, "prompt_tokens_details": {"cached_tokens": _hit(job)} if self.cfg.cache_report else None}
        return {
            **totals,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if details else None,
            "prompt_tokens_details": {"cached_tokens": _hit(job)} if self.cfg.cache_report else None,
        }

    def _run(self, job: Job) -> Generator[Piece, None, None]:
        """Wait for a running slot, look the prompt up in the prefix cache, then yield tokens as they come."""
        s = self.stats
        with self._cond:
            s.queued += 1
            try:
                self._cond.wait_for(lambda: s.running < self.admission.max_running_requests, timeout=STALL_S)
            finally:
                s.queued -= 1
            s.running += 1
            hit = self.cache.lookup(job.ids, job.salt).hit_tokens if self.cfg.prefix_cache else 0
            job.cached = max(min(hit, len(job.ids) - 1), 0)
        if job.rehit is not None and job.cached:
            job.done = job.rehit(job.cached)
        if self.cfg.mimic == "sglang" and not job.transferred:  # a PD decode runs no prefill batch
            self.log.info(
                f"Prefill batch. #new-seq: 1, #new-token: {len(job.ids) - job.cached}, #cached-token: "
                f"{job.cached}, token usage: {s.kv_used_tokens / s.kv_total_tokens:.2f}, #running-req: "
                f"{s.running}, #queue-req: {s.queued}"
            )
        last = job.started
        try:
            # A decode does not prefill what it received: only the tokens neither cached nor sent cost prefill.
            ready = max(job.cached, min(job.cached + job.transferred, len(job.ids) - 1))
            for i in self.gpu.tokens(len(job.ids), ready, job.done.tokens):
                now = time.monotonic()
                (self.metrics.ttft if i == 0 else self.metrics.itl).observe(now - last)
                last = now
                job.generated = i + 1
                yield job.done.pieces[i]
        finally:
            self._finish(job)

    def _finish(self, job: Job) -> None:
        full = job.ids + token_ids("".join(p.text for p in job.done.pieces[: job.generated]))
        s = self.stats
        with self._cond:
            s.running -= 1
            self._cond.notify()
            self.cache.insert(full, turn_boundaries=[*job.boundaries, len(full)], salt=job.salt)
            s.kv_used_tokens = self.cache.used_tokens
            s.prompt_tokens += len(job.ids)
            s.cached_tokens += job.cached
        queried = len(job.ids) if self.cfg.prefix_cache else 0
        reason = job.done.finish_reason if job.generated == job.done.tokens else "abort"
        self.metrics.finished(len(job.ids), job.generated, job.cached, queried, reason)
        self.metrics.e2e.observe(time.monotonic() - job.started)

    def flush_cache(self) -> bool:
        """Drop every cached prefix, as the engines' flush endpoints do; refused while requests run."""
        with self._cond:
            if self.stats.running or self.stats.queued:
                return False
            self.cache.clear()
            self.stats.kv_used_tokens = 0
            return True


def _hit(job: Job) -> int:
    """The prompt tokens usage reports as cached."""
    return job.cached if job.reported_hit is None else job.reported_hit
