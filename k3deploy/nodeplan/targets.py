"""Which executor target reaches each node of a topology: node settings, then command-line options, then
the topology's launch defaults."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, TypeAdapter

from k3deploy.executors.target import ExecTarget, ExecutorKind
from k3deploy.topology.schema import Topology

TARGET: TypeAdapter[ExecTarget] = TypeAdapter(ExecTarget)


class ExecOverrides(BaseModel):
    """Command-line options that override the topology's `launch` settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    executor: ExecutorKind | None = None
    ssh_user: str | None = None
    ssh_key: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = "~/.ssh/config"
    accept_new_host_keys: bool = False
    connect_timeout_s: float | None = None
    ray_address: str | None = None
    ssh_jump: str | None = None


def targets_for(topology: Topology, overrides: ExecOverrides | None = None) -> dict[int, ExecTarget]:
    """One target per rank: node ssh settings, then command-line options, then launch.ssh defaults."""
    o = overrides or ExecOverrides()
    launch = topology.launch
    kind = o.executor or launch.executor
    out: dict[int, ExecTarget] = {}
    for rank, node in topology.ordered_nodes():
        ssh = node.ssh
        # Every setting any kind takes; the target model of `kind` keeps its own (executors/target.py).
        settings = {
            "kind": kind, "host": node.host,
            "user": (ssh.user if ssh else None) or o.ssh_user or launch.ssh.user,
            "port": ssh.port if ssh else None,
            "key": (ssh.key if ssh else None) or o.ssh_key or launch.ssh.key,
            "known_hosts": o.known_hosts or launch.ssh.known_hosts,
            "ssh_config": o.ssh_config, "accept_new_host_keys": o.accept_new_host_keys,
            "connect_timeout_s": o.connect_timeout_s or launch.ssh.connect_timeout_s,
            "jump": (ssh.jump if ssh else None) or o.ssh_jump or launch.ssh.jump,
            "ray_address": o.ray_address or launch.ray_address, "node_ip": node.ip,
        }  # fmt: skip
        out[rank] = TARGET.validate_python(settings)
    return out
