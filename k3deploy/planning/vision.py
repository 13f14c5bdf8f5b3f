"""The vision tower's weights per GPU, where each engine keeps them. Pure.

vLLM (Kimi-K3's model.py builds K2.5's MoonViT3dPretrainedModel inside `_mark_tower_model(vllm_config, "image")`,
vllm-project/vllm vllm/models/kimi_k3/nvidia/model.py @006193b5): the tower is not built when the image limit is
0 (SupportsMultiModal._mark_tower_model: "skipped when --limit-mm-per-prompt is set to zero for all of their
modalities"); its linear layers are TP-sharded (kimi_k25_vit.py: QKVParallelLinear, Column/RowParallelLinear with
disable_tp=use_data_parallel) unless `--mm-encoder-tp-mode data`, or the encoder's heads do not divide over TP, in
which case every rank holds all of it (vision.py is_vit_use_data_parallel: "Falling back to data parallelism for
the vision encoder"). SGLang (python/sglang/srt/models/kimi_k25.py @00a239e5): its MoonViT splits attention over
TP (VisionAttention use_qkv_parallel) but k3deploy has not checked that its MLP does, so it is counted whole on
every rank: an upper bound. The checkpoint's non-expert bytes already hold the tower, counted / attention TP in
the budget; what an engine keeps beyond that share is the `extra` below."""
from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

from k3deploy.catalog.specs import DTYPE_BYTES, ModelSpec
from k3deploy.engines.kinds import Family
from k3deploy.engines.shape import Shape
from k3deploy.topology.schema import Topology

Placement = Literal["sharded", "replicated", "skipped", "absent"]


class VisionPlan(NamedTuple):
    """The vision tower on one GPU."""

    tower_bytes: int  # the whole tower and projector (BF16)
    per_gpu_bytes: int  # what one rank holds
    counted_bytes: int  # what the budget's non-expert weights line already counts of it (tower / attention TP)
    placement: Placement
    why: str

    @property
    def extra_bytes(self) -> int:
        """What the engine holds per GPU beyond the budget's share (0 when sharded or skipped)."""
        return max(0, self.per_gpu_bytes - self.counted_bytes)

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value, the extra included."""
        return {**self._asdict(), "extra_bytes": self.extra_bytes}


def vision_plan(t: Topology, model: ModelSpec, family: Family, shape: Shape) -> VisionPlan | None:
    """Where the engine keeps `model`'s vision tower and what it costs per GPU (None: a text-only model)."""
    v = model.vision
    if v is None:
        return None
    tower = v.params * DTYPE_BYTES[v.dtype]
    counted = math.ceil(tower / shape.attn_tp)
    if tower == 0:
        return VisionPlan(0, 0, counted, "absent", "the checkpoint has no vision tower")
    limit = t.serving.images_per_request
    if family == "vllm":
        if limit == 0:
            return VisionPlan(tower, 0, counted, "skipped", "serving.images_per_request 0: vLLM does not build the "
                              "tower when --limit-mm-per-prompt allows no image")
        if str(t.engine.args.get("--mm-encoder-tp-mode", "")) == "data":
            return VisionPlan(tower, tower, counted, "replicated", "--mm-encoder-tp-mode data: every rank runs the "
                              "whole tower on its own images")
        if v.num_heads % shape.tp:
            return VisionPlan(tower, tower, counted, "replicated", f"{v.num_heads} encoder heads do not divide over "
                              f"TP {shape.tp}: vLLM falls back to data parallelism, the whole tower on every rank")
        return VisionPlan(tower, math.ceil(tower / shape.tp), counted, "sharded",
                          f"{v.num_heads} encoder heads over TP {shape.tp}: vLLM shards the tower's linear layers")
    return VisionPlan(tower, tower, counted, "replicated", "SGLang: counted whole on every rank (its MoonViT "
                      "splits attention over TP; the MLP's split is not checked, so this is an upper bound)")
