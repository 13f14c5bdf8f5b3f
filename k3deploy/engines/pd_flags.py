"""One prefill or decode instance's disaggregation flags and env, for SGLang and vLLM. Pure."""
from __future__ import annotations

import json

from k3deploy.engines.argv_opts import Opt
from k3deploy.engines.argv_opts import opt as _o
from k3deploy.engines.context import Inputs, Place

# vLLM's NixlConnector: every instance both sends and receives (the router decides who prefills), as in
# vLLM's NIXL examples (docs/features/nixl_connector_usage.md).
NIXL_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def sglang_pd_opts(inp: Inputs) -> list[Opt]:
    """SGLang's --disaggregation-* flags of this instance (none outside PD)."""
    d = inp.pd
    if d is None:
        return []
    o = [_o("--disaggregation-mode", d.mode), _o("--disaggregation-transfer-backend", d.backend)]
    if d.bootstrap_port is not None:
        # Only prefill runs the bootstrap server; decode learns each prefill's port from the router.
        o.append(_o("--disaggregation-bootstrap-port", d.bootstrap_port))
    if d.ib_devices:
        o.append(_o("--disaggregation-ib-device", ",".join(d.ib_devices)))
    if d.mode == "decode" and inp.topology.serving.prefix_cache:
        # SGLang's decode keeps no radix cache in PD mode unless asked: turn 2 of a conversation would miss.
        o.append(_o("--disaggregation-decode-enable-radix-cache"))
    return o


def vllm_pd_opts(inp: Inputs) -> list[Opt]:
    """vLLM's --kv-transfer-config of this instance (none outside PD)."""
    if inp.pd is None:
        return []
    return [_o("--kv-transfer-config", json.dumps(NIXL_CONFIG, separators=(",", ":")))]


def pd_env(inp: Inputs, place: Place) -> dict[str, str]:
    """The transfer's env on one node: vLLM NIXL's side channel on this node's own ip (a value shared by
    every node gives an engine-ID mismatch, vllm#27083) and its port; UCX's devices for NIXL."""
    d = inp.pd
    if d is None:
        return {}
    env: dict[str, str] = {}
    if d.side_channel_port is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = place.ip
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(d.side_channel_port)
    if d.backend == "nixl" and d.ib_devices:
        env["UCX_NET_DEVICES"] = ",".join(d.ib_devices)
    return env
