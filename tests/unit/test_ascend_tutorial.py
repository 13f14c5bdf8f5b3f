"""vLLM-Ascend rendered as its Kimi-K3 tutorial runs it (seed 004, section 5.1 and the DSpark variant, 5.2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.render import render_nodes
from k3deploy.engines.spec import LaunchSpec
from tests.unit.test_render_support import doc_of, plan_file, plan_of

pytestmark = pytest.mark.timeout(30)
ASCEND = Path("topologies/ascend-a3-4x16-vllm.yaml")
NODE0_IP, NIC = "10.0.0.10", "ens-priv"

# Seed 004 section 5.1, "Run on Node 0" / "Run on Nodes 1 through 3" (MODEL_PATH: the topology's model.path,
# TOKENIZER_PATH beside it, SERVICE_PORT 8000, RPC_PORT 13345, DP_SIZE 4, TP_SIZE 16).
FLAGS = {"--host": "0.0.0.0", "--port": "8000", "--served-model-name": "kimi-k3",
         "--tokenizer": "/models/Kimi-K3-w4a8", "--tokenizer-mode": "kimi_k3", "--quantization": "ascend",
         "--safetensors-load-strategy": "lazy", "--tensor-parallel-size": "16", "--data-parallel-size": "4",
         "--data-parallel-size-local": "1", "--data-parallel-address": NODE0_IP, "--data-parallel-rpc-port": "13345",
         "--max-model-len": "133120", "--max-num-seqs": "16", "--max-num-batched-tokens": "8192",
         "--gpu-memory-utilization": "0.85", "--reasoning-parser": "kimi_k3", "--tool-call-parser": "kimi_k3",
         "--compilation-config": '{"cudagraph_mode":"FULL_DECODE_ONLY"}'}
SWITCHES = ("--enable-expert-parallel", "--enable-prefix-caching", "--enable-auto-tool-choice")
# "Set these variables on every node" (LOCAL_IP, NIC_NAME per node).
ENV = {"GLOO_SOCKET_IFNAME": NIC, "TP_SOCKET_IFNAME": NIC, "HCCL_SOCKET_IFNAME": NIC,
       "VLLM_ENGINE_READY_TIMEOUT_S": "7200", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3000",
       "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "HCCL_BUFFSIZE": "1024", "HCCL_BUFFSIZE_EP": "2048",
       "HCCL_INTRA_PCIE_ENABLE": "1", "HCCL_INTRA_ROCE_ENABLE": "0", "HCCL_OP_EXPANSION_MODE": "AIV",
       "OMP_PROC_BIND": "false", "OPENBLAS_NUM_THREADS": "1",
       "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(i) for i in range(16))}


def opt(spec: LaunchSpec, flag: str) -> str | None:
    argv = list(spec.argv)
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_every_flag_and_variable_of_the_tutorials_multinode_command() -> None:
    specs = render_nodes(plan_file(ASCEND).render_inputs())
    assert len(specs) == 4
    for spec in specs:
        for flag, value in FLAGS.items():
            assert opt(spec, flag) == value, (spec.rank, flag)
        assert all(s in spec.argv for s in SWITCHES)
        assert {k: spec.env[k] for k in ENV} == ENV
        assert spec.env["HCCL_IF_IP"] == spec.env["VLLM_HOST_IP"]  # LOCAL_IP
        worker = spec.rank > 0
        assert ("--headless" in spec.argv) == worker
        assert opt(spec, "--data-parallel-start-rank") == (str(spec.rank) if worker else None)


def test_each_tutorial_setting_is_overridable() -> None:
    doc = doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--max-num-batched-tokens": 4096,
                                                            "--safetensors-load-strategy": None,
                                                            "--tokenizer": "/models/tok"},
                                           "engine.env": {"HCCL_OP_EXPANSION_MODE": "HOST"}})
    head = render_nodes(plan_of(doc).render_inputs())[0]
    assert opt(head, "--max-num-batched-tokens") == "4096" and "--safetensors-load-strategy" not in head.argv
    assert opt(head, "--tokenizer") == "/models/tok" and head.env["HCCL_OP_EXPANSION_MODE"] == "HOST"


def test_the_dspark_variant_renders_as_the_tutorial_writes_it() -> None:
    """Section 5.2: the same speculative config on Node 0 and every headless worker."""
    config = {"method": "dspark", "model": "/models/Kimi-K3-DSpark", "num_speculative_tokens": 7,
              "draft_tensor_parallel_size": 16, "max_model_len": 4096, "draft_sample_method": "greedy",
              "enforce_eager": True}
    doc = doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--speculative-config": json.dumps(config)}})
    plan = plan_of(doc)
    for spec in render_nodes(plan.render_inputs()):
        assert json.loads(opt(spec, "--speculative-config") or "{}") == config
        for flag, value in FLAGS.items():
            assert opt(spec, flag) == value, (spec.rank, flag)


def test_dspark_on_w4a8_is_budgeted_like_dspark_on_mxfp4() -> None:
    """The draft's weights (per attention-TP rank) and its KV per token come out of the caches, as on MXFP4."""
    config = {"method": "dspark", "model": "/models/Kimi-K3-DSpark", "num_speculative_tokens": 7}
    base = plan_of(doc_of("ascend-a3-4x16-vllm")).memory
    spec = plan_of(doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--speculative-config": json.dumps(config)}}))
    m, cat = spec.memory, load_catalog()
    assert base is not None and m is not None
    draft = cat.model("kimi-k3-w4a8").draft
    assert draft is not None and draft == cat.model("kimi-k3").draft
    assert m.draft_weights_bytes == -(-draft.weights_bytes // 16) and base.draft_weights_bytes == 0
    assert m.draft_kv_bytes_per_token == cat.engines["vllm-ascend"].draft_kv_bytes_per_token
    assert m.kv_tokens < base.kv_tokens


def test_vllm_on_nvidia_gets_the_k3_recipes_load_path_and_tail_fusion() -> None:
    """The K3 guide, section 35: --load-format fastsafetensors and VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION=1."""
    doc = doc_of("h100-4x8-sglang", **{"engine.kind": "vllm", "serving.max_running_requests": 32})
    head = render_nodes(plan_of(doc).render_inputs())[0]
    assert opt(head, "--load-format") == "fastsafetensors"
    assert head.env["VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION"] == "1"
    ascend = render_nodes(plan_file(ASCEND).render_inputs())[0]
    assert "--load-format" not in ascend.argv and "VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION" not in ascend.env
