"""Resolve the mimicked engine's parsed flags and env into one frozen ServeConfig, as that engine would."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from k3deploy.sim.engine_args import Mimic, engine_version, flag_table

SGLANG_DEFAULT_DIST_TIMEOUT_S = 1800  # torch's default process-group timeout, which SGLang keeps when unset
SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998  # --disaggregation-bootstrap-port's default
VLLM_DEFAULT_READY_TIMEOUT_S = 600  # VLLM_ENGINE_READY_TIMEOUT_S default
VLLM_DEFAULT_DP_RPC_PORT = 29550
VLLM_DEFAULT_MAX_NUM_SEQS = 256
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class ConfigError(Exception):
    """A start-up error the real engine raises after parsing (exit 1, not argparse's exit 2)."""


@dataclass(frozen=True)
class Rendezvous:
    """Where and how this node joins the Gloo group: one rank per node."""

    host: str
    port: int
    node_rank: int
    nnodes: int
    timeout_s: float

    @property
    def init_method(self) -> str:
        """torch.distributed init_method URL (port 0: the head picks a free port; single node only)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


@dataclass(frozen=True)
class ServeConfig:
    """Everything the stand-in needs from the flags, normalised across the two engines."""

    mimic: Mimic
    version: str
    model_path: str
    served_model_name: str
    bind_host: str
    port: int
    serves_api: bool
    dummy_health: bool
    rendezvous: Rendezvous
    tp: int
    ep: int
    pp: int
    dp: int
    dcp: int
    attention_dp: bool
    gpus_per_node: int
    mem_fraction: float | None
    context_length: int | None
    max_running_requests: int | None
    pool_ratio: float | None
    kv_cache_dtype: str
    ssm_dtype: str | None
    prefix_cache: bool
    radix_cache_strategy: str
    prefix_match_unit: int | None
    moe_backend: str
    decode_attention_backend: str | None
    reasoning_parser: str | None
    tool_parser: str | None
    auto_tool_choice: bool
    cache_report: bool
    metrics: bool
    chunked_prefill_size: int | None
    max_prefill_tokens: int | None
    args: dict[str, Any] = field(default_factory=dict)
    # SGLang's --disaggregation-mode (None: not disaggregated) and the prefill's bootstrap server port.
    pd_mode: str | None = None
    bootstrap_port: int = SGLANG_DEFAULT_BOOTSTRAP_PORT
    # vLLM --kv-transfer-config's kv_load_failure_policy: fail the request, or recompute the prompt here.
    kv_failure_policy: str = "fail"

    @property
    def head(self) -> bool:
        """Node rank 0: the rendezvous point and the API server."""
        return self.rendezvous.node_rank == 0

    @property
    def tool_calls_structured(self) -> bool:
        """Whether K3's tool-call tokens are parsed into `tool_calls` (vLLM also needs auto tool choice)."""
        if self.tool_parser != "kimi_k3":
            return False
        return self.mimic == "sglang" or self.auto_tool_choice


def bind_address(host: str | None, node_ip: str | None) -> str:
    """The address to listen on: a wildcard becomes the node's own loopback IP when it has one."""
    wanted = "0.0.0.0" if host is None else host
    # Several stand-in "nodes" share one machine on 127.0.0.x: each binds its own address so that
    # every node can use the same port, as distinct hosts would.
    if wanted in WILDCARD_HOSTS and node_ip and node_ip.startswith("127."):
        return node_ip
    return wanted


def _host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"ValueError: invalid --dist-init-addr {addr!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _sglang(ns: argparse.Namespace, env: Mapping[str, str]) -> ServeConfig:
    nnodes, rank = ns.nnodes, ns.node_rank
    if ns.dist_init_addr:
        host, port = _host_port(ns.dist_init_addr)
    else:
        host, port = "127.0.0.1", 0  # SGLang falls back to loopback: fine alone, a hang across nodes
    timeout_s = float(ns.dist_timeout or SGLANG_DEFAULT_DIST_TIMEOUT_S)
    attention_dp = ns.attn_dp_size > 1 or (ns.enable_dp_attention and ns.dp_size > 1)
    dp = ns.attn_dp_size if ns.attn_dp_size > 1 else ns.dp_size
    gpus = ns.tp_size * ns.pp_size * (1 if attention_dp else dp)
    strategy = "extra_buffer" if ns.mamba_radix_cache_strategy == "auto" else ns.mamba_radix_cache_strategy
    node_ip = env.get("SGLANG_HOST_IP") or env.get("HOST_IP")
    pd_mode = ns.disaggregation_mode if ns.disaggregation_mode in ("prefill", "decode") else None
    # A decode server's KV cache is a chunk cache unless its radix cache is asked for (server_args.py).
    radix = not ns.disable_radix_cache and (pd_mode != "decode" or ns.disaggregation_decode_enable_radix_cache)
    return ServeConfig(
        mimic="sglang",
        version=engine_version("sglang"),
        model_path=ns.model_path,
        served_model_name=ns.served_model_name or ns.model_path,
        bind_host=bind_address(ns.host, node_ip),
        port=ns.port,
        serves_api=rank == 0,
        dummy_health=rank > 0,
        rendezvous=Rendezvous(host, port, rank, nnodes, timeout_s),
        tp=ns.tp_size,
        ep=ns.ep_size,
        pp=ns.pp_size,
        dp=dp,
        dcp=ns.dcp_size,
        attention_dp=attention_dp,
        gpus_per_node=max(1, gpus // max(nnodes, 1)),
        mem_fraction=ns.mem_fraction_static,
        context_length=ns.context_length,
        max_running_requests=ns.max_running_requests,
        pool_ratio=ns.mamba_full_memory_ratio,
        kv_cache_dtype=ns.kv_cache_dtype,
        ssm_dtype=ns.mamba_ssm_dtype,
        prefix_cache=radix,
        radix_cache_strategy=strategy,
        prefix_match_unit=None,
        moe_backend=ns.moe_runner_backend,
        decode_attention_backend=ns.decode_attention_backend,
        reasoning_parser=ns.reasoning_parser,
        tool_parser=ns.tool_call_parser,
        auto_tool_choice=True,
        cache_report=ns.enable_cache_report,
        metrics=ns.enable_metrics,
        chunked_prefill_size=ns.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        args={k: _jsonable(v) for k, v in vars(ns).items() if k != "model_path_positional"},
        pd_mode=pd_mode,
        bootstrap_port=ns.disaggregation_bootstrap_port,
    )


def _check_vllm_parsers(ns: argparse.Namespace) -> None:
    registries = flag_table("vllm")["registries"]
    for dest, what in (("reasoning_parser", "reasoning parser"), ("tool_call_parser", "tool call parser")):
        name = getattr(ns, dest)
        if name and name not in registries[dest]:
            raise ConfigError(
                f"KeyError: 'invalid {what}: {name} (chose from {{ {','.join(registries[dest])} }})'"
            )
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        raise ConfigError("TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser")


def _vllm_rendezvous(ns: argparse.Namespace, env: Mapping[str, str]) -> Rendezvous:
    timeout_s = float(
        ns.distributed_timeout_seconds
        or env.get("VLLM_ENGINE_READY_TIMEOUT_S")
        or VLLM_DEFAULT_READY_TIMEOUT_S
    )
    dp_form = ns.data_parallel_size_local is not None or ns.data_parallel_address is not None
    if ns.nnodes > 1:
        if dp_form and ns.headless and ns.data_parallel_size_local % ns.nnodes:
            raise ConfigError(
                f"ValueError: data_parallel_size_local ({ns.data_parallel_size_local}) must be divisible "
                f"by nnodes ({ns.nnodes})"
            )
        world = ns.data_parallel_size * ns.pipeline_parallel_size * ns.tensor_parallel_size
        if world % ns.nnodes:
            raise ConfigError(
                f"ValueError: world size DP x PP x TP ({world}) must be divisible by nnodes ({ns.nnodes})"
            )
        return Rendezvous(ns.master_addr, ns.master_port, ns.node_rank, ns.nnodes, timeout_s)
    if dp_form:
        local = ns.data_parallel_size_local or ns.data_parallel_size
        if ns.data_parallel_size % local:
            raise ConfigError(
                f"ValueError: data_parallel_size ({ns.data_parallel_size}) must be divisible by "
                f"data_parallel_size_local ({local})"
            )
        start = ns.data_parallel_start_rank or 0
        return Rendezvous(
            ns.data_parallel_address or "127.0.0.1",
            ns.data_parallel_rpc_port or VLLM_DEFAULT_DP_RPC_PORT,
            start // local,
            ns.data_parallel_size // local,
            timeout_s,
        )
    return Rendezvous("127.0.0.1", 0, 0, 1, timeout_s)


def _kv_transfer(ns: argparse.Namespace) -> dict[str, Any]:
    """--kv-transfer-config as vLLM reads it (a JSON object)."""
    raw = ns.kv_transfer_config
    if raw is None or isinstance(raw, dict):
        return raw or {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"ValueError: --kv-transfer-config is not valid JSON: {raw!r}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"ValueError: --kv-transfer-config must be a JSON object, got {raw!r}")
    return value


def _vllm(ns: argparse.Namespace, env: Mapping[str, str]) -> ServeConfig:
    _check_vllm_parsers(ns)
    kv = _kv_transfer(ns)
    rdv = _vllm_rendezvous(ns, env)
    tp, pp, dp = ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size
    local_dp = ns.data_parallel_size_local or dp
    gpus = tp * pp * dp // rdv.nnodes if ns.nnodes > 1 else tp * pp * local_dp
    served = ns.served_model_name[0] if ns.served_model_name else ns.model_tag
    max_len = ns.max_model_len if ns.max_model_len and ns.max_model_len > 0 else None
    ssm = None if ns.mamba_ssm_cache_dtype == "auto" else ns.mamba_ssm_cache_dtype
    return ServeConfig(
        mimic="vllm",
        version=engine_version("vllm"),
        model_path=ns.model_tag,
        served_model_name=served,
        bind_host=bind_address(ns.host, env.get("VLLM_HOST_IP")),
        port=ns.port,
        serves_api=not ns.headless,
        dummy_health=False,
        rendezvous=rdv,
        tp=tp,
        ep=tp * dp if ns.enable_expert_parallel else 1,
        pp=pp,
        dp=dp,
        dcp=ns.decode_context_parallel_size,
        attention_dp=False,
        gpus_per_node=max(1, gpus),
        mem_fraction=ns.gpu_memory_utilization,
        context_length=max_len,
        max_running_requests=ns.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS,
        pool_ratio=None,
        kv_cache_dtype=ns.kv_cache_dtype,
        ssm_dtype=ssm,
        prefix_cache=ns.enable_prefix_caching is True,
        radix_cache_strategy="enabled",
        prefix_match_unit=int(ns.prefix_match_unit) if ns.prefix_match_unit else None,
        moe_backend=ns.moe_backend,
        decode_attention_backend=ns.attention_backend,
        reasoning_parser=ns.reasoning_parser or None,
        tool_parser=ns.tool_call_parser,
        auto_tool_choice=ns.enable_auto_tool_choice,
        cache_report=ns.enable_prompt_tokens_details,
        metrics=True,
        chunked_prefill_size=ns.max_num_batched_tokens,
        max_prefill_tokens=ns.max_num_batched_tokens,
        args={k: _jsonable(v) for k, v in vars(ns).items()},
        # NixlConnector: each server prefills or decodes as the request's kv_transfer_params say.
        pd_mode="nixl" if kv.get("kv_connector") == "NixlConnector" else None,
        kv_failure_policy=str(kv.get("kv_load_failure_policy") or "fail"),
    )


def resolve_config(mimic: Mimic, ns: argparse.Namespace, env: Mapping[str, str]) -> ServeConfig:
    """Build the ServeConfig from parsed engine flags and the process environment."""
    return _sglang(ns, env) if mimic == "sglang" else _vllm(ns, env)
