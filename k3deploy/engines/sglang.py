"""SGLang 0.5.23 (`sglang serve MODEL ...`): the flags one node gets, before the user's engine.args."""
from __future__ import annotations

import json

from k3deploy.engines.argv_opts import Opt, decimal
from k3deploy.engines.argv_opts import opt as _o
from k3deploy.engines.context import Inputs, Place, host_port
from k3deploy.engines.kernels import sglang_kernel_opts
from k3deploy.engines.pd_flags import sglang_pd_opts

KV_DTYPES = {"bf16": "bf16", "fp8": "fp8_e4m3"}
SSM_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def parser_opts(inp: Inputs) -> list[Opt]:
    """The reasoning and tool parsers the model's catalog entry names (a model without them gets none)."""
    p = inp.model.parsers
    return [_o(flag, name) for flag, name in (("--reasoning-parser", p.reasoning_parser),
                                               ("--tool-call-parser", p.tool_call_parser)) if name]


def sglang_opts(inp: Inputs, place: Place) -> tuple[Opt, ...]:
    """Parallelism, rendezvous, memory, cache, kernels, parsers and reporting for one node."""
    t, s, shape = inp.topology, inp.topology.serving, inp.shape
    # A stable name for clients (the engine would answer with the checkpoint path); engine.args overrides it.
    o = [_o("--host", "0.0.0.0"), _o("--port", t.engine.port),
         _o("--served-model-name", inp.model.served_model_name or t.model.id), _o("--tp-size", shape.tp)]
    if shape.ep > 1:
        o.append(_o("--ep-size", shape.ep))
    if shape.pp > 1:
        o.append(_o("--pp-size", shape.pp))
    if shape.attention_dp and shape.dp > 1:
        o.append(_o("--attn-dp-size", shape.dp))
    if shape.dcp > 1:
        o.append(_o("--dcp-size", shape.dcp))
    if place.nnodes > 1:
        # Without --dist-init-addr SGLang falls back to loopback: every node would rendezvous with itself.
        o += [_o("--nnodes", place.nnodes), _o("--node-rank", place.rank),
              _o("--dist-init-addr", host_port(place.head_ip, t.launch.port))]
    o.append(_o("--dist-timeout", t.launch.dist_timeout_s))
    if inp.mem_fraction is not None:
        o.append(_o("--mem-fraction-static", decimal(inp.mem_fraction)))
    o.append(_o("--context-length", s.context_length))
    if s.max_running_requests is not None:  # unset: SGLang admits what its KDA state pool holds
        o.append(_o("--max-running-requests", s.max_running_requests))
    o += [_o("--kv-cache-dtype", KV_DTYPES[s.kv_cache_dtype or inp.model.cache.kv_cache_dtype]),
          _o("--mamba-ssm-dtype", SSM_DTYPES[s.state_dtype or inp.model.cache.ssm_state_dtype])]
    if s.prefix_cache:
        o.append(_o("--mamba-radix-cache-strategy", s.prefix_cache_strategy))
    else:
        o.append(_o("--disable-radix-cache"))
    if inp.pool_ratio is not None:
        o.append(_o("--mamba-full-memory-ratio", decimal(inp.pool_ratio)))
    o += sglang_kernel_opts(inp.hardware, shape.dcp)
    o += parser_opts(inp)
    if s.images_per_request is not None:
        o.append(_o("--limit-mm-data-per-request", json.dumps({"image": s.images_per_request})))
    o += [_o("--enable-cache-report"), _o("--enable-metrics")]
    o += sglang_pd_opts(inp)
    return tuple(o)
