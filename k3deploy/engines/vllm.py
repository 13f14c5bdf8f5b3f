"""vLLM 0.33.0 and vLLM-Ascend (`vllm serve MODEL ...`): the flags one node gets, before engine.args."""
from __future__ import annotations

import json

from k3deploy.engines.argv_opts import Opt, decimal
from k3deploy.engines.argv_opts import opt as _o
from k3deploy.engines.context import Inputs, Place
from k3deploy.engines.kernels import vllm_kernel_opts
from k3deploy.engines.pd_flags import vllm_pd_opts
from k3deploy.engines.sglang import parser_opts

SSM_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
# vLLM-Ascend as its Kimi-K3 tutorial runs it on Atlas A3 (section 5.1, table 9.1): lazy safetensors loading, an
# 8192-token step budget and ACL graphs for decode only; each overridable in engine.args.
ASCEND_TUTORIAL_OPTS = (Opt("--safetensors-load-strategy", ("lazy",)), Opt("--max-num-batched-tokens", ("8192",)),
                        Opt("--compilation-config", ('{"cudagraph_mode":"FULL_DECODE_ONLY"}',)))
# The two multi-node forms; vLLM rejects a command that mixes them ("must be divisible").
NNODES_DESTS = frozenset({"nnodes", "node_rank", "master_addr", "master_port"})
DP_RANK_DESTS = frozenset({"data_parallel_size_local", "data_parallel_start_rank", "data_parallel_address",
                           "data_parallel_rpc_port"})


def dp_size_local(inp: Inputs) -> int:
    """DP ranks per node in the per-node DP form (the planner makes tp x pp divide gpus_per_node)."""
    s = inp.shape
    return max(1, s.gpus_per_node // (s.tp * s.pp))


def multinode_opts(inp: Inputs, place: Place) -> list[Opt]:
    """Per-node DP ranks when dp > 1, else one TP/PP group spread with --nnodes; never both."""
    t, s = inp.topology, inp.shape
    o: list[Opt] = []
    if s.dp > 1:
        o.append(_o("--data-parallel-size", s.dp))
        if place.nnodes > 1:
            local = dp_size_local(inp)
            o += [_o("--data-parallel-size-local", local), _o("--data-parallel-address", place.head_ip),
                  _o("--data-parallel-rpc-port", t.launch.port)]
            if not place.head:
                # Only headless nodes take a start rank: on the head it turns on hybrid load balancing, and vLLM
                # then refuses the headless nodes at start ("Remote engine 1 must not use --headless in
                # external or hybrid dp lb mode", vllm/engine/arg_utils.py).
                o.append(_o("--data-parallel-start-rank", place.rank * local))
    elif place.nnodes > 1:
        o += [_o("--nnodes", place.nnodes), _o("--node-rank", place.rank),
              _o("--master-addr", place.head_ip), _o("--master-port", t.launch.port)]
    if place.nnodes > 1 and not place.head:
        o.append(_o("--headless"))  # workers serve no HTTP; rank 0 runs the API server
    return o


def vllm_opts(inp: Inputs, place: Place) -> tuple[Opt, ...]:
    """Parallelism, multi-node form, memory, prefix caching, parsers and kernels for one node."""
    t, s, shape = inp.topology, inp.topology.serving, inp.shape
    # A stable name for clients (the engine would answer with the checkpoint path); engine.args overrides it.
    o = [_o("--host", "0.0.0.0"), _o("--port", t.engine.port),
         _o("--served-model-name", inp.model.served_model_name or t.model.id), _o("--tensor-parallel-size", shape.tp)]
    if shape.pp > 1:
        o.append(_o("--pipeline-parallel-size", shape.pp))
    if shape.dcp > 1:
        o.append(_o("--decode-context-parallel-size", shape.dcp))
    if shape.ep > 1:
        o.append(_o("--enable-expert-parallel"))  # EP = TP x DP
    o += multinode_opts(inp, place)
    if inp.mem_fraction is not None:
        o.append(_o("--gpu-memory-utilization", decimal(inp.mem_fraction)))
    o.append(_o("--max-model-len", s.context_length))
    if s.max_running_requests is not None:  # engine_rules refuses a vLLM topology without it
        o.append(_o("--max-num-seqs", s.max_running_requests))
    if (s.kv_cache_dtype or inp.model.cache.kv_cache_dtype) == "fp8":
        o.append(_o("--kv-cache-dtype", "fp8"))
    o.append(_o("--mamba-ssm-cache-dtype", SSM_DTYPES[s.state_dtype or inp.model.cache.ssm_state_dtype]))
    if s.prefix_cache:
        o.append(_o("--enable-prefix-caching"))  # off by default for K3
    o.append(_o("--enable-prompt-tokens-details"))
    if inp.model.parsers.tokenizer_mode:
        o.append(_o("--tokenizer-mode", inp.model.parsers.tokenizer_mode))
    o += parser_opts(inp)
    if s.images_per_request is not None:  # 0: the vision tower is not even built (SupportsMultiModal._mark_tower_model)
        o.append(_o("--limit-mm-per-prompt", json.dumps({"image": s.images_per_request})))
    if inp.model.parsers.tool_call_parser:
        o.append(_o("--enable-auto-tool-choice"))  # the tool parser is used only with auto tool choice
    o += vllm_kernel_opts(inp.hardware)
    if inp.flavour == "vllm-ascend" and inp.model.quantization == "ascend":
        o.append(_o("--quantization", "ascend"))  # the W4A8 checkpoint; vanilla vLLM has no such method
    if t.engine.kind == "vllm" and inp.hardware.vendor == "nvidia":
        o.append(_o("--load-format", "fastsafetensors"))  # the vLLM K3 recipe's fast load path (the K3 guide, 35)
    if inp.flavour == "vllm-ascend":
        # The tutorial names the tokenizer files apart from the weights; here they sit beside them.
        o += [_o("--tokenizer", t.model.path), *ASCEND_TUTORIAL_OPTS]
    o += vllm_pd_opts(inp)
    return tuple(o)
