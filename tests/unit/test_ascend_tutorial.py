"""vLLM-Ascend rendered as its Kimi-K3 tutorial runs it (seed 004, section 5.1 and the DSpark variant, 5.2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.render import render_nodes
from k3deploy.engines.spec import LaunchSpec
from tests.unit.plan_helpers import plan_of as plan_unchecked
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


# vLLM's capture_model line (gpu_model_runner.py, "Graph capturing finished in %.0f secs, took %.2f GiB") and
# vLLM-Ascend's eager line (vllm_ascend/platform.py), each with vLLM's worker log prefix.
CAPTURED = "(Worker_DP0_TP0 pid=311) INFO 12-04 10:02:11 [gpu_model_runner.py:6582] Graph capturing finished in " \
           "41 secs, took 0.62 GiB"
EAGER = "(APIServer pid=200) INFO 12-04 10:00:02 [platform.py:969] Compilation disabled, using eager mode by default"
LOADED = "(Worker_DP0_TP0 pid=311) INFO 12-04 10:01:30 [model_runner_v1.py:3571] Loading model weights took 26.68 GB"


def test_the_kernels_stage_wants_the_tutorials_acl_graphs_on_ascend() -> None:
    from k3deploy.engines.kernels import kernel_needs
    from k3deploy.engines.log_lines import log_lines
    from k3deploy.validate.stages.kernels import read_kernels

    cat, lines = load_catalog(), log_lines("vllm")
    needs = kernel_needs(cat.hardware["ascend-a3"], "vllm")
    assert needs.graph == "FULL_DECODE_ONLY" and needs.moe is None and "debug level" in needs.reason
    assert kernel_needs(cat.hardware["h100-80gb"], "vllm").graph is None
    ok = read_kernels(f"{LOADED}\n{CAPTURED}", lines, needs)
    assert ok.problems == [] and ok.summary.endswith("ACL graphs captured in 41 s") and CAPTURED in ok.seen
    eager = read_kernels(f"{EAGER}\n{LOADED}", lines, needs)
    assert len(eager.problems) == 1 and eager.problems[0].startswith(
        "decode runs eagerly, needs FULL_DECODE_ONLY ACL graphs: (APIServer pid=200)")
    assert "drop --enforce-eager" in eager.problems[0] and '{"cudagraph_mode":"FULL_DECODE_ONLY"}' in eager.problems[0]
    skipped = read_kernels("Skipping CUDA graph capture. To turn on CUDA graph capture, ensure `cudagraph_mode` "
                           "was not manually set to `NONE`\n" + CAPTURED, lines, needs)
    assert skipped.problems and skipped.summary.endswith("ACL graphs off")
    silent = read_kernels(LOADED, lines, needs)
    assert silent.problems == [("no line says the ACL graphs were captured (1 log lines read; vllm-ascend "
                                "main@182b75ea84 logs 'Graph capturing finished in N secs')")]


def test_eagle3_on_w4a8_is_budgeted_and_a_draft_quantization_vllm_ascend_ignores_warns() -> None:
    """EAGLE-3 on the W4A8 target: the draft's weights, its own KV and the verify's state slots, as DSpark's; a
    `quantization` in the speculative config warns (vLLM-Ascend resets it to the target's, platform.py)."""
    config = {"method": "eagle3", "model": "/models/kimi-k3-eagle3", "num_speculative_tokens": 3,
              "quantization": "ascend"}
    base = plan_of(doc_of("ascend-a3-4x16-vllm")).memory
    plan = plan_of(doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--speculative-config": json.dumps(config)}}))
    m, draft = plan.memory, load_catalog().model("kimi-k3-w4a8").eagle3_draft
    assert base is not None and m is not None and draft is not None
    assert m.draft_weights_bytes == -(-draft.weights_bytes // 16) and m.draft_kv_bytes_per_token == 1152
    assert m.kv_tokens < base.kv_tokens and "SPEC_DRAFT_UNBUDGETED" not in {i.code for i in plan.issues}
    (quant,) = [i for i in plan.issues if i.code == "SPEC_DRAFT_QUANT"]
    assert quant.severity == "warning" and "vLLM-Ascend ignores it" in quant.message
    assert quant.hint and quant.hint.startswith("drop quantization from --speculative-config")


@pytest.mark.parametrize(("draft", "tokens"), [("RadixArk/Kimi-K3-DSpark", 7), ("Inferact/Kimi-K3-DSpark", 7),
                                               ("Inferact/Kimi-K3-DSpark-Block5", 5)])
def test_each_tutorial_draft_plans_with_its_token_count_and_only_with_it(draft: str, tokens: int) -> None:
    """Section 3.1/5.2: seven speculative tokens for the GQA and MLA drafts, five for the Block5 one."""
    def codes(n: int) -> set[str]:
        config = {"method": "dspark", "model": f"/models/{draft.split('/')[1]}", "num_speculative_tokens": n}
        doc = doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--speculative-config": json.dumps(config)}})
        return {i.code for i in plan_unchecked(doc).issues if i.code.startswith("SPEC_")}

    assert codes(tokens) == set()
    assert codes(12 - tokens) == {"SPEC_DRAFT_TOKENS"}
