"""Flags + env -> ServeConfig: rendezvous address per engine form, parser flags, start-up errors, faults."""

from __future__ import annotations

import pytest

from k3deploy.sim.engine_args import parse_engine_args
from k3deploy.sim.faults import FaultError, parse_faults
from k3deploy.sim.serve_config import ConfigError, ServeConfig, bind_address, resolve_config

pytestmark = pytest.mark.timeout(30)

SGLANG_NODE = (
    "--mimic sglang /models/k3 --tp-size 32 --ep-size 32 --nnodes 4 --node-rank 2 "
    "--dist-init-addr 10.231.0.10:29500 --dist-timeout 3600 --mem-fraction-static 0.85 "
    "--context-length 131072 --max-running-requests 16 --mamba-full-memory-ratio 0.9 "
    "--kv-cache-dtype bf16 --mamba-ssm-dtype float32 --moe-runner-backend marlin "
    "--decode-attention-backend flashmla --reasoning-parser kimi_k3 --tool-call-parser kimi_k3 "
    "--enable-cache-report --enable-metrics --host 0.0.0.0 --port 30000"
)


def sglang(argv: str, env: dict[str, str] | None = None) -> ServeConfig:
    return resolve_config("sglang", parse_engine_args("sglang", argv.split()), env or {})


def vllm(argv: str, env: dict[str, str] | None = None) -> ServeConfig:
    return resolve_config(
        "vllm", parse_engine_args("vllm", ["--mimic", "vllm", "/models/k3", *argv.split()]), env or {}
    )


def test_sglang_multi_node_command() -> None:
    cfg = sglang(SGLANG_NODE, {"SGLANG_HOST_IP": "10.231.0.12"})
    rdv = cfg.rendezvous
    assert (rdv.host, rdv.port, rdv.node_rank, rdv.nnodes, rdv.timeout_s) == (
        "10.231.0.10",
        29500,
        2,
        4,
        3600,
    )
    assert rdv.init_method == "tcp://10.231.0.10:29500"
    assert (cfg.tp, cfg.ep, cfg.gpus_per_node, cfg.mem_fraction, cfg.context_length) == (
        32,
        32,
        8,
        0.85,
        131072,
    )
    assert not cfg.head and not cfg.serves_api and cfg.dummy_health
    assert cfg.prefix_cache and cfg.cache_report and cfg.metrics and cfg.tool_calls_structured
    assert cfg.bind_host == "0.0.0.0"  # a real host IP keeps the wildcard
    assert cfg.radix_cache_strategy == "extra_buffer"  # `auto`


def test_sglang_switches_off() -> None:
    cfg = sglang("--mimic sglang /m --disable-radix-cache")
    assert not cfg.prefix_cache and not cfg.cache_report and not cfg.metrics and cfg.tool_parser is None
    assert cfg.rendezvous.nnodes == 1 and cfg.rendezvous.port == 0 and cfg.head and cfg.serves_api


def test_loopback_nodes_bind_their_own_address() -> None:
    assert bind_address("0.0.0.0", "127.0.0.3") == "127.0.0.3"
    assert bind_address(None, "127.0.0.2") == "127.0.0.2"
    assert bind_address("0.0.0.0", "10.0.0.2") == "0.0.0.0"
    assert bind_address("127.0.0.1", "127.0.0.3") == "127.0.0.1"
    assert (
        sglang("--mimic sglang /m --host 0.0.0.0", {"SGLANG_HOST_IP": "127.0.0.4"}).bind_host == "127.0.0.4"
    )
    assert vllm("", {"VLLM_HOST_IP": "127.0.0.2", "SGLANG_HOST_IP": "127.0.0.9"}).bind_host == "127.0.0.2"


def test_vllm_nnodes_form() -> None:
    cfg = vllm(
        "--tensor-parallel-size 32 --enable-expert-parallel --nnodes 4 --node-rank 3 --master-addr 10.0.0.1 "
        "--master-port 29501 --headless --max-model-len 131072 --enable-prefix-caching",
        {"VLLM_ENGINE_READY_TIMEOUT_S": "1800"},
    )
    rdv = cfg.rendezvous
    assert (rdv.host, rdv.port, rdv.node_rank, rdv.nnodes, rdv.timeout_s) == ("10.0.0.1", 29501, 3, 4, 1800)
    assert (cfg.tp, cfg.ep, cfg.gpus_per_node, cfg.context_length) == (32, 32, 8, 131072)
    assert not cfg.serves_api and not cfg.dummy_health and cfg.prefix_cache


def test_vllm_data_parallel_form() -> None:
    cfg = vllm("-dp 4 -dpl 1 -dpr 2 -dpa 10.0.0.1 -dpp 13345 -tp 16 --headless")
    rdv = cfg.rendezvous
    assert (rdv.host, rdv.port, rdv.node_rank, rdv.nnodes) == ("10.0.0.1", 13345, 2, 4)
    assert cfg.gpus_per_node == 16 and cfg.ep == 1


def test_vllm_defaults_keep_k3_features_off() -> None:
    cfg = vllm("")
    assert not cfg.prefix_cache and not cfg.cache_report and cfg.metrics
    assert cfg.reasoning_parser is None and not cfg.tool_calls_structured
    assert cfg.rendezvous.timeout_s == 600


def test_vllm_tool_parser_needs_auto_tool_choice() -> None:
    assert not vllm("--tool-call-parser kimi_k3").tool_calls_structured
    assert vllm("--tool-call-parser kimi_k3 --enable-auto-tool-choice").tool_calls_structured
    assert not vllm("--tool-call-parser kimi_k2 --enable-auto-tool-choice").tool_calls_structured


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--enable-auto-tool-choice", "--enable-auto-tool-choice requires --tool-call-parser"),
        ("--reasoning-parser kimi_k9", "invalid reasoning parser: kimi_k9"),
        ("--tool-call-parser nope", "invalid tool call parser: nope"),
        ("--nnodes 2 --node-rank 1 -dp 4 -dpl 1 --headless", "must be divisible"),
    ],
)
def test_vllm_start_up_errors(argv: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        vllm(argv)


def test_faults_parse_with_values_and_rank_filter() -> None:
    env = {"K3SIM_FAULT": "slow_load:2.5, wrong_kernel"}
    faults = parse_faults(env, 0)
    assert "slow_load" in faults and "wrong_kernel" in faults and "oom" not in faults
    assert faults.seconds("slow_load", 10) == 2.5
    assert faults.seconds("hang_at_rendezvous", 99999) == 3600  # bounded
    only_two = {**env, "K3SIM_FAULT_RANK": "2"}
    assert "slow_load" not in parse_faults(only_two, 0) and "slow_load" in parse_faults(only_two, 2)
    with pytest.raises(FaultError, match="unknown fault"):
        parse_faults({"K3SIM_FAULT": "segfault"}, 0)
    with pytest.raises(FaultError, match="takes a number"):
        parse_faults({"K3SIM_FAULT": "slow_load:soon"}, 0)
