"""The parallel shape of a deployment under one engine's rules."""
from __future__ import annotations

from typing import Any, NamedTuple

from k3deploy.engines.kinds import Family as EngineFamily


class Shape(NamedTuple):
    """tp/ep/dp/pp/dcp with what follows from them (JSON field names are a stable contract)."""

    tp: int
    ep: int
    dp: int
    pp: int
    dcp: int
    attention_dp: bool
    attn_tp: int
    world_size: int
    nnodes: int
    gpus_per_node: int
    experts_per_rank: int
    expert_shards: int

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value (the `plan --json` shape object)."""
        return self._asdict()


def make_shape(
    family: EngineFamily, *, tp: int, ep: int, dp: int, pp: int, dcp: int, attention_dp: bool,
    nnodes: int, gpus_per_node: int, num_experts: int,
) -> Shape:
    """Derive attention TP, world size and expert sharding the way the engine does."""
    if family == "sglang":
        # SGLang: attention DP lives inside TP (attn_tp = tp / dp); experts always span the TP group.
        attn_tp = tp // dp if attention_dp and dp and tp % dp == 0 else tp
        world = tp * pp
        shards = tp
    else:
        # vLLM: DP replicates attention; with expert parallel EP = TP x DP, else experts are TP-sharded.
        attn_tp = tp
        world = tp * pp * dp
        shards = ep if ep > 1 else tp
    per_rank = num_experts // ep if ep and num_experts % ep == 0 else num_experts // max(ep, 1)
    return Shape(tp=tp, ep=ep, dp=dp, pp=pp, dcp=dcp, attention_dp=attention_dp, attn_tp=attn_tp,
                 world_size=world, nnodes=nnodes, gpus_per_node=gpus_per_node,
                 experts_per_rank=per_rank, expert_shards=shards)
