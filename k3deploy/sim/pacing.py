"""The stand-in's performance model of its accelerator: when each token of a request comes out.

A roofline per GPU of the serving group, from catalog figures only (bandwidth_tbps, bf16_tflops, the
model's byte counts) and the stand-in's own layout (attention TP, expert shards):

- weights read per decode step of a batch of b requests: non-expert bytes / attn_tp, plus routed-expert
  bytes / expert shards x the share of experts b tokens touch, 1 - (1 - k/E)^b (k active of E);
- plus each running request's MLA KV (kv bytes per token x its context) and KDA state;
- FLOPs per token: 2 x active parameters per GPU (BF16 non-expert weights are 2 B each, experts
  expert_bits_per_weight bits);
- decode step(b) = max(bytes / bandwidth, b x FLOPs per token / compute): every running request gets one
  token per step, so inter-token latency is the step time and grows with the batch;
- prefill of n uncached tokens = max((n x FLOPs per token + MLA attention) / compute, weights / bandwidth),
  the attention 2 x heads / attn_tp x (qk_nope + qk_rope + v_head) x MLA layers / DCP FLOPs per token for each
  token it attends to (the cached ones, and half the new ones on average); cached tokens cost nothing else,
  and one prefill runs at a time (requests arriving together queue for it).

Every duration is divided by the speed factor K3SIM_SPEED (default 1), so tests can run the same model
faster. Given the same arrivals the model is deterministic; only the host's sleep jitter is not, and
each request sleeps to absolute deadlines so jitter never accumulates over a stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from k3deploy.catalog.specs import HardwareSpec, ModelSpec

SPEED_ENV = "K3SIM_SPEED"
BF16 = 2


class PacingError(ValueError):
    """The speed factor or the accelerator's figures cannot drive the model."""


def speed_factor(env: Mapping[str, str]) -> float:
    """K3SIM_SPEED as a positive float (1 when unset)."""
    raw = env.get(SPEED_ENV) or "1"
    try:
        speed = float(raw)
    except ValueError:
        speed = 0.0
    if not speed > 0:
        raise PacingError(f"{SPEED_ENV}={raw!r}: expected a number > 0 (2 runs twice as fast)")
    return speed


@dataclass(frozen=True)
class PerfModel:
    """Per-GPU roofline figures; all methods return seconds already divided by the speed factor."""

    fixed_bytes: float
    expert_bytes: float
    expert_share: float
    flops_per_token: float
    attention_flops: float  # per prompt token, for each token it attends to (MLA, prefill)
    kv_bytes_per_token: float
    state_bytes_per_request: float
    bandwidth_bps: float
    flops_per_s: float
    speed: float
    decode_slowdown: float = 1.0  # the slow_decode fault: every decode step takes this many times longer

    @classmethod
    def build(
        cls,
        model: ModelSpec,
        hw: HardwareSpec,
        *,
        attn_tp: int,
        expert_shards: int,
        kv_bytes_per_token: float,
        state_bytes_per_request: float,
        dcp: int = 1,
        speed: float = 1.0,
        decode_slowdown: float = 1.0,
    ) -> PerfModel:
        """The model for one GPU of a replica laid out as given."""
        if hw.bf16_tflops is None:
            raise PacingError(
                f"hardware {hw.id} has no bf16_tflops in the catalog; the stand-in cannot pace it"
            )
        arch, w = model.architecture, model.weights
        share = arch.num_experts_per_token / arch.num_experts
        active_params = w.non_expert_bytes / BF16 / attn_tp + (
            w.routed_expert_bytes * 8 / w.expert_bits_per_weight * share / expert_shards
        )
        width = arch.qk_nope_head_dim + arch.qk_rope_head_dim + arch.v_head_dim
        return cls(
            fixed_bytes=w.non_expert_bytes / attn_tp,
            expert_bytes=w.routed_expert_bytes / expert_shards,
            expert_share=share,
            flops_per_token=2 * active_params,
            attention_flops=2 * arch.num_attention_heads / attn_tp * width * len(arch.full_attn_layers) / dcp,
            kv_bytes_per_token=kv_bytes_per_token,
            state_bytes_per_request=state_bytes_per_request,
            bandwidth_bps=hw.bandwidth_tbps * 1e12,
            flops_per_s=hw.bf16_tflops * 1e12,
            speed=speed,
            decode_slowdown=decode_slowdown,
        )

    def step_s(self, batch: int, context_tokens: int = 0) -> float:
        """One decode step for `batch` running requests holding `context_tokens` in all."""
        b = max(batch, 1)
        touched = 1 - (1 - self.expert_share) ** b
        read = (
            self.fixed_bytes
            + self.expert_bytes * touched
            + self.kv_bytes_per_token * context_tokens
            + self.state_bytes_per_request * b
        )
        step = max(read / self.bandwidth_bps, b * self.flops_per_token / self.flops_per_s)
        return step * self.decode_slowdown / self.speed

    def prefill_s(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        """Prefill of the tokens the prefix cache did not cover (0 when nothing is left to compute), each
        attending to the cached ones and to half the new ones on average."""
        if uncached_tokens <= 0:
            return 0.0
        weights = (self.fixed_bytes + self.expert_bytes) / self.bandwidth_bps
        attended = max(cached_tokens, 0) + uncached_tokens / 2
        flops = uncached_tokens * (self.flops_per_token + self.attention_flops * attended)
        return max(flops / self.flops_per_s, weights) / self.speed

    def describe(self) -> dict[str, float]:
        """Headline figures for /server_info and the bench (seconds, after the speed factor)."""
        return {
            "speed": self.speed,
            "decode_step_s_batch1": self.step_s(1),
            "decode_step_s_per_context_token": self.kv_bytes_per_token / self.bandwidth_bps / self.speed,
            "prefill_s_per_token": self.flops_per_token / self.flops_per_s / self.speed,
        }


class Gpu:
    """The shared accelerator: who is decoding (the batch) and the one prefill at a time (no model: no waits)."""

    def __init__(self, perf: PerfModel | None) -> None:
        self.perf = perf
        self._lock = threading.Lock()
        self._prefill = threading.Lock()
        self.batch = 0
        self.context_tokens = 0

    def tokens(self, prompt_tokens: int, cached_tokens: int, count: int) -> Iterator[int]:
        """Yield 0..count-1, each when that token is generated (prefill first, then one per step)."""
        if count <= 0:
            return
        perf = self.perf
        if perf is not None:
            with self._prefill:  # the GPU prefills one request at a time
                _sleep_until(time.monotonic() + perf.prefill_s(prompt_tokens - cached_tokens, cached_tokens))
        context = prompt_tokens + 1
        with self._lock:
            self.batch += 1
            self.context_tokens += context
        try:
            yield 0  # the first token comes out of the prefill
            due = time.monotonic()
            for i in range(1, count):
                with self._lock:
                    step = perf.step_s(self.batch, self.context_tokens) if perf is not None else 0.0
                    self.context_tokens += 1
                context += 1
                due += step
                _sleep_until(due)
                yield i
        finally:
            with self._lock:
                self.batch -= 1
                self.context_tokens -= context


def _sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)
