"""What a renderer needs: the deployment inputs, one node's place in it, and the engine flavour."""
from __future__ import annotations

from dataclasses import dataclass

from k3deploy.catalog.specs import HardwareSpec, ModelSpec
from k3deploy.engines.flag_tables import FlagTable, flag_table
from k3deploy.engines.kinds import FAMILY, Family, Flavour, engine_flavour
from k3deploy.engines.launchers import Launcher, resolve_launcher
from k3deploy.engines.shape import Shape
from k3deploy.topology.schema import Topology


@dataclass(frozen=True)
class Disaggregation:
    """One prefill or decode instance's part in PD serving: its mode, the transfer and its ports."""

    mode: str  # "prefill" | "decode"
    backend: str
    bootstrap_port: int | None  # SGLang prefill: its bootstrap server
    side_channel_port: int | None  # vLLM NIXL: this instance's side-channel base port
    ib_devices: tuple[str, ...] = ()


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
    pd: Disaggregation | None = None  # set on a prefill or decode instance

    @property
    def flavour(self) -> Flavour:
        """The real engine whose command line this deployment gets (the stand-in copies it)."""
        return engine_flavour(self.topology.engine, self.hardware.vendor)

    @property
    def family(self) -> Family:
        """Whose CLI and flag table the command line follows (vLLM-Ascend keeps vLLM's)."""
        return FAMILY[self.flavour]

    @property
    def table(self) -> FlagTable:
        """The flag table of the pinned engine version."""
        return flag_table(self.family)

    @property
    def launcher(self) -> Launcher:
        """The argv prefix before the model (engine.launcher, else the engine's console script) and its form."""
        e = self.topology.engine
        return resolve_launcher(e.launcher, e.kind, self.table, self.family, python=self.python)


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
