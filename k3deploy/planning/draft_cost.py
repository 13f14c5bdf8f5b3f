"""What speculative decoding's draft adds to one verify step, per GPU, term by term as the target's step:

- reads: the draft's weights / attention TP (it runs in the target's TP group), the shared LM head again for
  the drafted positions (vocab-parallel over TP), and the running requests' draft KV (context x the engine's
  draft_kv_bytes_per_token);
- compute: 2 FLOPs per draft weight for each of the drafts + 1 block positions of every request, the LM head
  over the drafted positions, and the draft's MLA attention over the context, at the BF16 rate;
- collectives: two all-reduces per draft layer (attention and FFN outputs) over attention TP;
- per-layer overhead: the draft's layers x layer_overhead_us.

The draft runs before the verify forward (the verify needs its tokens), so its time adds to the step's.
The verify step's larger batch (drafts + 1 tokens per request) is the target's own step (perf_model).
"""
from __future__ import annotations

from typing import NamedTuple

from k3deploy.planning.perf_model import BF16, PerfInputs, PerfUnknown, Step, Term, allreduce_s, rates


class DraftCost(NamedTuple):
    """The draft's share of one verify step and how it is made up."""

    seconds: float
    reads_s: float
    compute_s: float
    collectives_s: float
    overhead_s: float
    how: str


NO_DRAFT = DraftCost(0.0, 0.0, 0.0, 0.0, 0.0, "no speculative decoding")


def draft_cost(inp: PerfInputs, b_attn: int, context_tokens: float) -> DraftCost:
    """The draft's passes for `b_attn` requests per attention group averaging `context_tokens` each."""
    if inp.drafts == 0:
        return NO_DRAFT
    d = inp.model.draft
    if d is None:
        raise PerfUnknown(f"model {inp.model.id} has no `draft` in the catalog: the draft model's cost cannot be "
                          "timed (add its weights_bytes, num_layers, passes_per_step with sources, --catalog DIR)")
    a, s, perf = inp.model.architecture, inp.shape, inp.perf
    passes = d.passes_per_step or inp.drafts
    block = inp.drafts + 1  # the positions one DSpark pass computes per request
    lm_head = a.vocab_size * a.hidden_size * BF16 if d.shares_lm_head else 0
    weights = (d.weights_bytes + lm_head) / s.attn_tp * passes
    kv = b_attn * context_tokens * inp.draft_kv_bytes_per_token * passes
    bw = inp.hw.bandwidth_tbps * 1e12 * perf.hbm_efficiency * inp.speed
    reads = (weights + kv) / bw
    r_dense, _ = rates(inp)
    attention = 2 * a.num_attention_heads / s.attn_tp * context_tokens * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
    flops = passes * b_attn * (block * (2 * d.weights_bytes / BF16 / s.attn_tp + attention * d.num_layers)
                               + inp.drafts * 2 * lm_head / BF16 / s.attn_tp)
    compute = flops / r_dense / inp.speed
    coll = 0.0
    if perf.collectives:
        coll = passes * d.num_layers * 2 * allreduce_s(inp, s.attn_tp, b_attn * block * a.hidden_size * BF16)
        coll /= inp.speed
    overhead = passes * d.num_layers * perf.layer_overhead_us * 1e-6 / inp.speed
    gb = 1e9
    how = (f"{passes} pass of {d.num_layers} layers x {block} positions: reads ({d.weights_bytes / s.attn_tp / gb:.2f} "
           f"weights + {lm_head / s.attn_tp / gb:.2f} LM head + {kv / gb:.2f} draft KV) GB, {flops / 1e12:.3f} "
           f"TFLOP, {d.num_layers * 2} all-reduces, {d.num_layers} x {perf.layer_overhead_us:g} us")
    return DraftCost(max(reads, compute) + coll + overhead, reads, compute, coll, overhead, how)


def with_draft(step: Step, cost: DraftCost) -> Step:
    """The verify step with the draft's passes added as their own term."""
    if cost is NO_DRAFT:
        return step
    return step._replace(draft_s=cost.seconds, terms=(*step.terms, Term("draft model", cost.seconds, cost.how)))
