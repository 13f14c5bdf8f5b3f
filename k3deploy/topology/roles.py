"""The roles section (prefill/decode disaggregation, xPyD): each role's instances, nodes and parallel shape,
and the transfer backend that moves the MLA KV and the KDA state from prefill to decode."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
from typing import Literal

from pydantic import Field, field_validator

from k3deploy.topology.base import Strict
from k3deploy.topology.nodes import HOST_RE, IFACE_RE
from k3deploy.topology.settings import Parallel

TransferBackend = Literal["mooncake", "nixl", "ascend"]


class RoleGroup(Strict):
    """One role: `instances` copies of one parallel shape, each on its own nodes."""

    instances: int = Field(1, ge=1, le=256, description="how many instances of this role (the x or y of xPyD)")
    nodes: list[str] = Field(min_length=1, description="the hosts (or ips) of this role's nodes, in rank "
                             "order, cut in order into `instances` equal groups")
    parallel: Parallel = Field(default_factory=Parallel, description="the parallel shape of one instance")

    @field_validator("nodes")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not HOST_RE.fullmatch(n)]
        if bad:
            raise ValueError(f"not host names or ips: {bad}")
        return v


class Transfer(Strict):
    """How decode fetches what prefill computed, and the ports and devices that carry it."""

    backend: TransferBackend | None = Field(
        None, description="SGLang: mooncake | nixl | ascend (--disaggregation-transfer-backend); vLLM: nixl "
        "(NixlConnector in --kv-transfer-config); default: mooncake for SGLang, nixl for vLLM")
    bootstrap_port: int = Field(8998, ge=1, le=65535, description="SGLang: prefill instance i runs its bootstrap "
                                "server on bootstrap_port + i; the router is given the same port after --prefill")
    side_channel_port: int = Field(5600, ge=1, le=65535, description="vLLM NIXL: instance k's "
                                   "VLLM_NIXL_SIDE_CHANNEL_PORT is side_channel_port + k x the larger DP size "
                                   "(each DP rank listens on that base + its DP index)")
    ib_devices: list[str] | None = Field(None, description="RDMA devices for the transfer, e.g. [mlx5_0, mlx5_1] "
                                         "(SGLang --disaggregation-ib-device; vLLM/NIXL UCX_NET_DEVICES)")

    @field_validator("ib_devices")
    @classmethod
    def _devices(cls, v: list[str] | None) -> list[str] | None:
        bad = [d for d in v or () if not IFACE_RE.fullmatch(d)]
        if bad:
            raise ValueError(f"not device names: {bad}")
        return v


class Roles(Strict):
    """Prefill/decode disaggregation: prefill instances hand each request's cache to decode instances."""

    prefill: RoleGroup = Field(description="the prefill role")
    decode: RoleGroup = Field(description="the decode role")
    transfer: Transfer = Field(default_factory=Transfer, description="the KV and KDA-state transfer")
