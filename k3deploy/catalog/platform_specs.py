"""Frozen catalog specs of what a model runs on: accelerators, their vendors' collective facts, each engine's
memory defaults and performance factors, the planner's defaults; every number has a source."""
# No `from __future__ import annotations` here (as in topology/): pydantic would compile every annotation
# string when the classes are created, on the start-up path of every command (half this module's import).
from typing import Literal

from pydantic import Field

from k3deploy.catalog.spec_base import GIB, Sourced, Spec


class HardwareSpec(Sourced):
    """One accelerator model."""

    id: str
    name: str
    vendor: Literal["nvidia", "amd", "huawei", "sim", "cpu"]
    arch: str
    memory_gib: float
    usable_gib: float
    bandwidth_tbps: float
    bf16_tflops: float | None = Field(None, description="dense BF16 tensor throughput, TFLOP/s (prefill pacing)")
    native_mxfp4: bool
    typical_gpus_per_node: int
    runtime_reserve_gib: float | None = None
    fp4_tflops: float | None = Field(None, description="dense FP4 (MXFP4) tensor throughput, TFLOP/s; none: FP4 "
                                     "weights are upcast and run at the BF16 rate (Marlin on Hopper)")
    scaleup_domain_gpus: int | None = Field(None, description="GPUs one scale-up fabric joins (NVLink domain): "
                                            "collectives inside it use scaleup_gbps")
    scaleup_gbps: float | None = Field(None, description="scale-up bandwidth per GPU, one direction, GB/s")
    scaleup_latency_us: float | None = Field(None, description="latency of one small collective inside the "
                                             "scale-up domain, microseconds")
    scaleout_gbps: float | None = Field(None, description="scale-out (network) bandwidth per GPU, one direction, "
                                        "GB/s")
    scaleout_latency_us: float | None = Field(None, description="latency of one small collective across nodes "
                                              "over the scale-out network, microseconds")
    scaleup_hop_latency_us: float | None = Field(None, description="a scale-up domain that spans nodes (multi-node "
                                                 "NVLink): each ring step of a collective that leaves the node adds "
                                                 "this, microseconds (2 (g - 1) steps for an all-reduce over g GPUs)")
    socket_hop_latency_us: float | None = Field(None, description="the collective library over TCP sockets (its "
                                                "RDMA transport disabled): each node-to-node ring step of a small "
                                                "collective, microseconds (2 (nodes - 1) steps per all-reduce)")
    perf_family: str | None = Field(None, description="the accelerator family the engines' performance factors are "
                                    "calibrated per (performance.<engine>.families); none: always extrapolated")

    @property
    def usable_bytes(self) -> int:
        """Usable memory per accelerator in bytes."""
        return round(self.usable_gib * GIB)

    @property
    def is_hopper(self) -> bool:
        """SM90: no FP4 tensor cores, K3 experts need Marlin."""
        return self.arch == "sm90"

    @property
    def is_blackwell(self) -> bool:
        """SM100/SM103: native MXFP4 kernels."""
        return self.arch.startswith("sm10")


class VendorSpec(Spec):
    """Collective library and the env names that pick its interface."""

    collective: str
    socket_ifname_env: tuple[str, ...]
    visible_devices_env: str | None
    alloc_conf_env: str | None
    host_ip_env: str | None = None
    rdma_disable_env: str | None = Field(None, description="env variable that turns the collective library's RDMA "
                                         "transport off (NCCL_IB_DISABLE=1: collectives run over TCP sockets)")


class ReplayRing(Sourced):
    """SGLang ReplaySSM for speculative verify (`--enable-linear-replayssm-spec`): no verify-intermediate
    KDA states; each state slot carries a ring of `ring_len` records of the step's inputs instead."""

    flag: str = Field(description="the engine flag that turns it on")
    len_flag: str = Field(description="the engine flag that sets the ring length")
    ring_len: int = Field(ge=1, description="records per slot when the length flag is unset")
    conv_vectors: int = Field(ge=0, description="head_dim vectors per KDA head per record in the conv-state dtype")
    fp32_vectors: int = Field(ge=0, description="head_dim vectors per KDA head per record in FP32")
    fp32_scalars: int = Field(ge=0, description="scalars per KDA head per record in FP32")


class EngineDefaults(Sourced):
    """Memory-model defaults of one engine."""

    version: str
    default_mem_fraction: float
    slots_per_request: dict[str, int]
    mamba_full_memory_ratio_default: float | None = None
    avg_request_tokens: int | None = None
    draft_kv_bytes_per_token: int | None = None
    speculative_extra_slots: int | None = None
    block_multiple_tokens: int | None = None
    replay_ring: ReplayRing | None = None


class FamilyPerformance(Sourced):
    """One engine's own factors on one accelerator family, and how far its predictions are known to hold."""

    kind: Literal["calibrated", "extrapolated", "derived"] = Field(description="calibrated: fitted on published "
                                                                   "measurements; extrapolated: the engine's factors "
                                                                   "(a few measured ones replaced); derived: the "
                                                                   "engine paces itself by these figures (the stand-in)")
    hbm_efficiency: float | None = Field(None, gt=0, le=1, description="replaces the engine's hbm_efficiency")
    compute_efficiency: float | None = Field(None, gt=0, le=1, description="replaces the engine's "
                                             "compute_efficiency")
    layer_overhead_us: float | None = Field(None, ge=0, description="replaces the engine's layer_overhead_us")
    request_layer_us: float | None = Field(None, ge=0, description="replaces the engine's request_layer_us")
    moe_intermediate_align: int | None = Field(None, ge=1, description="replaces the engine's "
                                               "moe_intermediate_align (the family's MoE kernel)")
    calibrated_on: tuple[str, ...] = Field((), description="the published measurements the factors were fitted "
                                           "on (cases of tests/assets/perf/published_k3.yaml); empty: none")
    band: float = Field(gt=0, description="relative half-width of the prediction's band: TPOT and throughput within "
                        "x (1 + band) either way of the prediction (the largest error over the published checks)")
    checked_on: tuple[str, ...] = Field((), description="the published measurements held back as checks")


class EnginePerformance(Sourced):
    """How one engine kind turns the accelerator's figures into decode steps and prefills (the performance
    model's efficiency factors; each calibrated once or documented, never fitted per case)."""

    hbm_efficiency: float = Field(gt=0, le=1, description="share of peak HBM bandwidth a decode step's reads reach")
    compute_efficiency: float = Field(gt=0, le=1, description="share of peak tensor throughput a forward step "
                                      "reaches (calibrated on prefill, where compute binds)")
    layer_overhead_us: float = Field(ge=0, description="time per layer per forward step beyond its reads, "
                                     "compute and collectives (kernel launches, norms, routing), microseconds")
    request_layer_us: float | None = Field(None, ge=0, description="time per running request per layer of a "
                                           "decode step beyond its reads, compute and collectives (per-request "
                                           "kernel work the roofline does not see), microseconds; none: 0")
    collectives: bool = Field(description="whether the engine runs the TP/EP/DCP collectives of each layer")
    prefill_stalls_decode: bool = Field(description="whether a prefill holds up the running batch's decode "
                                        "steps (SGLang, vLLM) or runs beside them (the stand-in)")
    kda_state_passes: int = Field(ge=1, description="times a decode step moves each request's KDA state "
                                  "through HBM (2: read and written back)")
    speed_env: str | None = Field(None, description="engine.env variable that scales every duration (the "
                                  "stand-in's K3SIM_SPEED); none for real engines")
    acceptance_env: str | None = Field(None, description="engine.env variable that pins the tokens a speculative "
                                       "verify step keeps (benchmark runs); none: the model's catalog figure")
    moe_intermediate_align: int | None = Field(None, ge=1, description="the MoE kernel pads each GPU's slice of "
                                               "an expert's intermediate size up to a multiple of this (its weights "
                                               "are read and multiplied padded); none: no padding")
    ep_rank_imbalance: bool = Field(True, description="whether a step waits for the EP rank whose whole "
                                    "experts the step's tokens touch most (real routing), or paces the mean rank "
                                    "(the stand-in)")
    families: dict[str, FamilyPerformance] = Field(default_factory=dict, description="accelerator family "
                                                   "(hardware perf_family) -> this engine's factors there")
    extrapolated_band: float | None = Field(None, gt=0, description="relative half-width of the band of a "
                                            "prediction on a family this engine has no entry for; none: the planner's "
                                            "extrapolated_band")


class PlannerDefaults(Sourced):
    """Planner-wide defaults."""

    runtime_reserve_gib: float
    extrapolated_band: float = Field(gt=0, description="relative half-width of a prediction's band where the engine "
                                     "has no factors calibrated on the accelerator's family: x (1 + band) either way")
    router_health_margin: float = Field(gt=1, description="the router's health-check timeout is this many times "
                                        "the predicted prefill of the longest prompt the plan allows")
