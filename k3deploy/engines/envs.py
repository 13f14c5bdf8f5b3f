"""One node's environment: interfaces, host IP, allocator, timeouts, then the user's engine.env."""
from __future__ import annotations

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs, Place
from k3deploy.engines.pd_flags import pd_env

# Both PyTorch allocators read the same setting; large K3 pools fragment without it.
ALLOC_CONF = "expandable_segments:True"
# vLLM-Ascend's multi-node examples raise HCCL's 200 MB default buffer for EP all-to-all.
HCCL_BUFFSIZE_MB = 1024
# The rest of the vLLM-Ascend Kimi-K3 tutorial's environment on every A3 node (section 5.1); engine.env overrides.
ASCEND_TUTORIAL_ENV = {
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3000", "HCCL_BUFFSIZE_EP": "2048", "HCCL_INTRA_PCIE_ENABLE": "1",
    "HCCL_INTRA_ROCE_ENABLE": "0", "HCCL_OP_EXPANSION_MODE": "AIV", "OMP_PROC_BIND": "false",
    "OPENBLAS_NUM_THREADS": "1",
}
# HCCL accepts a connect timeout between these bounds (seconds).
HCCL_CONNECT_TIMEOUT_RANGE_S = (120, 7200)


def node_env(inp: Inputs, place: Place, vendor: VendorSpec | None) -> dict[str, str]:
    """Plain (non-secret) env for one node; engine.env entries win over rendered ones."""
    t = inp.topology
    env: dict[str, str] = {}
    if vendor is not None:
        for name in vendor.socket_ifname_env:
            env[name] = place.iface  # unset is the classic rendezvous hang
        if vendor.host_ip_env:
            env[vendor.host_ip_env] = place.ip
        if vendor.alloc_conf_env:
            env[vendor.alloc_conf_env] = ALLOC_CONF
    if inp.flavour == "sglang":
        env["SGLANG_HOST_IP"] = place.ip
    else:
        env["VLLM_HOST_IP"] = place.ip  # vLLM ignores HOST_IP and MASTER_ADDR
        env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(t.launch.ready_timeout_s)
    if t.engine.kind == "vllm" and inp.hardware.vendor == "nvidia":
        env["VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION"] = "1"  # the vLLM K3 recipe's fused LatentMoE tail (guide, 35)
    if inp.flavour == "vllm-ascend":
        lo, hi = HCCL_CONNECT_TIMEOUT_RANGE_S
        env["HCCL_BUFFSIZE"] = str(HCCL_BUFFSIZE_MB)
        env["HCCL_CONNECT_TIMEOUT"] = str(min(max(t.launch.dist_timeout_s, lo), hi))
        env.update(ASCEND_TUTORIAL_ENV)
        if vendor is not None and vendor.visible_devices_env:
            env[vendor.visible_devices_env] = ",".join(str(i) for i in range(t.hardware.gpus_per_node))
    if t.engine.kind == "sim":
        env["K3SIM_GPU"] = t.hardware.gpu  # which accelerator the stand-in pretends to be
    env.update(pd_env(inp, place))
    env.update(t.engine.env)
    return env
