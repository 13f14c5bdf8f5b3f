"""What a renderer needs: the deployment inputs, one node's place in it, and the engine flavour."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from k3deploy.catalog.specs import HardwareSpec, ModelSpec
from k3deploy.engines.flags import FlagTable, flag_table, table_name
from k3deploy.planning.shape import Shape
from k3deploy.topology.schema import Topology

Flavour = Literal["sglang", "vllm", "vllm-ascend"]
SIM_MODULE_ARGV = ("-m", "k3deploy.sim", "serve")


@dataclass(frozen=True)
class Inputs:
    """A deployment as the renderers see it; memory figures are None when only checking flags."""

    topology: Topology
    model: ModelSpec
    hardware: HardwareSpec
    shape: Shape
    mem_fraction: float | None = None
    pool_ratio: float | None = None
    # The interpreter that runs the stand-in engine: a portable `python3` on remote nodes; the local
    # executor passes the one k3deploy runs under (the venv need not be activated).
    python: str = "python3"

    @property
    def flavour(self) -> Flavour:
        """The real engine whose command line this deployment gets (the stand-in copies it)."""
        e = self.topology.engine
        if e.kind == "sglang" or (e.kind == "sim" and getattr(e, "mimic", "sglang") == "sglang"):
            return "sglang"
        if e.kind == "vllm-ascend" or (e.kind == "sim" and self.hardware.vendor == "huawei"):
            return "vllm-ascend"
        return "vllm"

    @property
    def table(self) -> FlagTable:
        """The flag table of the pinned engine version."""
        return flag_table(table_name(self.topology.engine.kind, getattr(self.topology.engine, "mimic", None)))

    def executable(self) -> tuple[str, ...]:
        """The argv prefix before the model path: engine.launcher, else the engine's own entry."""
        e = self.topology.engine
        if e.launcher:
            return tuple(e.launcher)
        if e.kind == "sim":
            return (self.python, *SIM_MODULE_ARGV, "--mimic", "vllm" if self.flavour != "sglang" else "sglang")
        return ("sglang", "serve") if self.flavour == "sglang" else ("vllm", "serve")


@dataclass(frozen=True)
class Place:
    """One node's rank and addresses; `ip`/`head_ip` may be shell expansions in templated exports."""

    rank: int
    nnodes: int
    ip: str
    head_ip: str
    iface: str

    @property
    def head(self) -> bool:
        """Rank 0 serves the API and is the rendezvous point."""
        return self.rank == 0


def host_port(ip: str, port: int) -> str:
    """`ip:port`, bracketing IPv6."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def places(topology: Topology) -> tuple[Place, ...]:
    """Every node's place, rank 0 first."""
    ranked = topology.ordered_nodes()
    head_ip = ranked[0][1].ip
    n = len(ranked)
    return tuple(Place(rank=r, nnodes=n, ip=node.ip, head_ip=head_ip, iface=node.iface) for r, node in ranked)
