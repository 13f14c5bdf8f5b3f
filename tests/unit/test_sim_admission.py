"""Load-time decisions: the MoE kernel and its log line per accelerator, admission by planner arithmetic."""

from __future__ import annotations

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.catalog.specs import GIB
from k3deploy.sim.admission import BLACKWELL_MXFP4_LINE, Admission, admit
from k3deploy.sim.engine_args import parse_engine_args
from k3deploy.sim.model_info import config_for, model_spec
from k3deploy.sim.serve_config import resolve_config
from k3deploy.sim.tiny_config import tiny_config

pytestmark = pytest.mark.timeout(30)

K3_SGLANG = (
    "--tp-size 32 --ep-size 32 --nnodes 4 --node-rank 0 --dist-init-addr 10.0.0.1:29500 "
    "--mem-fraction-static 0.85 --context-length 131072 --max-running-requests 16"
)
K3_VLLM = (
    "--tensor-parallel-size 32 --enable-expert-parallel --nnodes 4 --master-addr 10.0.0.1 "
    "--max-model-len 131072"
)


def run(
    mimic: str, argv: str, model: str = "kimi-k3", gpu: str = "h100-80gb", wrong_kernel: bool = False
) -> Admission:
    cat = load_catalog()
    ns = parse_engine_args(mimic, ["--mimic", mimic, "/m", *argv.split()])  # type: ignore[arg-type]
    cfg = resolve_config(mimic, ns, {})  # type: ignore[arg-type]
    return admit(cfg, cat.models[model], cat.hardware[gpu], wrong_kernel=wrong_kernel)


def test_hopper_marlin_fits_with_the_documented_weights() -> None:
    adm = run("sglang", K3_SGLANG + " --moe-runner-backend marlin")
    assert adm.verdict == "ok" and adm.error is None
    assert adm.moe.log_line == "Kimi-K3 on SM90: moe_runner_backend=marlin (Marlin W4A16 kernels)."
    assert round(adm.budget.weights_bytes / GIB, 2) == 45.43
    assert adm.shape.experts_per_rank == 28


def test_hopper_auto_upcasts_silently_and_runs_out_of_memory() -> None:
    adm = run("sglang", K3_SGLANG)
    assert adm.moe.log_line is None and adm.moe.experts_bf16
    assert adm.verdict == "oom"
    assert adm.error is not None and adm.error.startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
    )
    assert "GPU 0 has a total capacity of 79.65 GiB" in adm.error
    assert adm.budget.weights_bytes > 3.5 * 45.43 * GIB * 0.9  # the >3.5x BF16 blow-up on the expert part


def test_blackwell_auto_resolves_to_flashinfer_mxfp4() -> None:
    adm = run(
        "sglang",
        "--tp-size 16 --ep-size 16 --nnodes 2 --dist-init-addr 10.0.0.1:1 --context-length 131072",
        gpu="b200",
    )
    assert adm.moe.backend == "flashinfer_mxfp4" and adm.moe.log_line == BLACKWELL_MXFP4_LINE
    assert adm.verdict == "ok"


def test_mem_fraction_too_low_is_sglangs_not_enough_memory() -> None:
    adm = run("sglang", K3_SGLANG.replace("0.85", "0.5") + " --moe-runner-backend marlin")
    assert adm.verdict == "no_cache"
    assert adm.error == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."


def test_vllm_on_hopper_picks_marlin_and_rejects_a_context_the_kv_pool_cannot_hold() -> None:
    ok = run("vllm", K3_VLLM + " --moe-backend marlin")
    assert ok.verdict == "ok" and ok.moe.log_line == "Using 'MARLIN' Mxfp4 MoE backend."
    assert ok.budget.block_tokens and ok.budget.block_tokens % 128 == 0
    short = run("vllm", K3_VLLM.replace("131072", "1048576") + " --moe-backend marlin")
    assert short.verdict == "kv_short"
    assert (
        short.error is not None
        and "To serve at least one request with the models's max seq len (1048576)" in short.error
    )


def test_wrong_kernel_fault_changes_the_kernel_line() -> None:
    vllm = run("vllm", K3_VLLM + " --moe-backend marlin", wrong_kernel=True)
    assert vllm.moe.backend == "triton"
    assert vllm.moe.log_line == (
        "No Mxfp4 MoE backend supports activation=silu. Falling back to 'triton' with BF16 activations."
    )
    sglang = run("sglang", K3_SGLANG + " --moe-runner-backend marlin", wrong_kernel=True)
    assert sglang.moe.backend == "triton" and "marlin (Marlin" not in (sglang.moe.log_line or "")


def test_tiny_model_fits_the_sim_accelerator() -> None:
    adm = run(
        "sglang",
        "--tp-size 4 --ep-size 4 --nnodes 4 --dist-init-addr 127.0.0.1:1 --context-length 32768",
        model="kimi-k3-tiny",
        gpu="sim",
    )
    assert adm.verdict == "ok" and adm.moe.backend == "flashinfer_mxfp4"
    assert adm.budget.kv_tokens > 32768 and adm.max_running_requests >= 1


def test_model_identity_comes_from_config_json() -> None:
    cat = load_catalog()
    assert model_spec(tiny_config()).id == "kimi-k3-tiny"
    assert model_spec(config_for(cat.models["kimi-k3"])).id == "kimi-k3"
    other = tiny_config()
    other["_name_or_path"] = "k3-variant"
    other["text_config"] = {**other["text_config"], "hidden_size": 512}
    spec = model_spec(other)
    assert (
        spec.id == "k3-variant" and spec.weights.total_bytes > cat.models["kimi-k3-tiny"].weights.total_bytes
    )


# (gpu, tp, GPUs per node, engine): the documented deployment shapes and their neighbours.
REFERENCE_SHAPES = [
    ("h100-80gb", 8, 8, "sglang"),
    ("h100-80gb", 16, 8, "sglang"),
    ("h100-80gb", 32, 8, "sglang"),
    ("h100-80gb", 16, 8, "vllm"),
    ("h100-80gb", 32, 8, "vllm"),
    ("h200", 16, 8, "sglang"),
    ("b200", 16, 8, "sglang"),
    ("b300", 8, 8, "sglang"),
    ("gb200", 8, 4, "sglang"),
    ("gb200", 16, 4, "sglang"),
    ("mi355x", 8, 8, "vllm"),
]


@pytest.mark.parametrize(("gpu", "tp", "per_node", "engine"), REFERENCE_SHAPES)
def test_planner_and_stand_in_agree_on_the_reference_shapes(
    gpu: str, tp: int, per_node: int, engine: str
) -> None:
    from tests.unit.plan_helpers import codes, plan_of, topology_dict

    nodes = tp // per_node
    plan = plan_of(topology_dict(gpu=gpu, tp=tp, ep=tp, nodes=nodes, per_node=per_node, kind=engine))
    assert plan.memory is not None
    if engine == "sglang":
        argv = (
            f"--tp-size {tp} --ep-size {tp} --nnodes {nodes} --dist-init-addr 10.0.0.1:1 "
            "--context-length 131072 --max-running-requests 32 --moe-runner-backend marlin "
            # The renderer passes the planner's pool ratio; SGLang itself would use 0.9.
            f"--mamba-full-memory-ratio {plan.memory.pool_ratio!r}"
        )
    else:
        argv = (
            f"--tensor-parallel-size {tp} --enable-expert-parallel --nnodes {nodes} --master-addr 10.0.0.1 "
            "--max-model-len 131072 --max-num-seqs 32 --enable-prefix-caching --moe-backend marlin"
        )
    adm = run(engine, argv, gpu=gpu)
    planner_fits = "MEM_WEIGHTS" not in codes(plan)
    assert planner_fits == (adm.verdict != "oom"), (plan.issues, adm.error)
    assert plan.memory.weights_bytes == adm.budget.weights_bytes
    if planner_fits:
        assert (plan.memory.kv_tokens, plan.memory.state_requests) == (
            adm.budget.kv_tokens,
            adm.budget.state_requests,
        )


def test_only_tp32_fits_h100_in_the_stand_in() -> None:
    verdicts = {
        tp: run(
            "sglang",
            f"--tp-size {tp} --ep-size {tp} --nnodes {max(tp // 8, 1)} --dist-init-addr 10.0.0.1:1 "
            "--context-length 131072 --moe-runner-backend marlin",
        ).verdict
        for tp in (1, 2, 4, 8, 16, 32)
    }
    assert [tp for tp, v in verdicts.items() if v != "oom"] == [32]
