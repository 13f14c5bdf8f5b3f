"""Which executor reaches each node, with what settings: JSON-able, so a supervisor can reopen it."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.executors.base import Executor
from k3deploy.topology.schema import Topology

ExecutorKind = Literal["local", "ssh", "ray"]


class ExecTarget(BaseModel):
    """How to reach one node; unused fields are ignored by executors of other kinds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ExecutorKind = Field(description="executor implementation")
    host: str = Field(description="host as the topology names it (address or ~/.ssh/config alias)")
    user: str | None = Field(None, description="ssh: login user (else ~/.ssh/config, else the local user)")
    port: int | None = Field(None, description="ssh: port (else ~/.ssh/config, else 22)")
    key: str | None = Field(None, description="ssh: private key file (else ~/.ssh/config, agent, ~/.ssh/id_*)")
    known_hosts: str = Field("~/.ssh/known_hosts", description="ssh: known_hosts file checked (and extended)")
    ssh_config: str | None = Field("~/.ssh/config", description="ssh: client config file for aliases")
    accept_new_host_keys: bool = Field(False, description="ssh: trust and save unknown host keys")
    connect_timeout_s: float = Field(10.0, gt=0, description="ssh: TCP + handshake timeout per attempt")
    jump: str | None = Field(None, description="ssh: jump hosts ([user@]host[:port],...), 'none', or None for "
                             "~/.ssh/config's ProxyJump")
    ray_address: str | None = Field(None, description="ray: cluster address (auto, HOST:6379, ray://HOST:10001)")
    node_ip: str | None = Field(None, description="ray: the node's `ip`, matched against the IPs of Ray's nodes")


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
        out[rank] = ExecTarget(
            kind=kind, host=node.host,
            user=(ssh.user if ssh else None) or o.ssh_user or launch.ssh.user,
            port=ssh.port if ssh else None,
            key=(ssh.key if ssh else None) or o.ssh_key or launch.ssh.key,
            known_hosts=o.known_hosts or launch.ssh.known_hosts,
            ssh_config=o.ssh_config, accept_new_host_keys=o.accept_new_host_keys,
            connect_timeout_s=o.connect_timeout_s or launch.ssh.connect_timeout_s,
            jump=(ssh.jump if ssh else None) or o.ssh_jump or launch.ssh.jump,
            ray_address=o.ray_address or launch.ray_address, node_ip=node.ip,
        )  # fmt: skip
    return out


def open_executor(target: ExecTarget) -> Executor:
    """A not-yet-connected Executor for the target (imports paramiko only for ssh)."""
    if target.kind == "local":
        from k3deploy.executors.local import LocalExecutor

        return LocalExecutor(target.host)
    if target.kind == "ssh":
        from k3deploy.executors.ssh import SshExecutor

        return SshExecutor(target)
    from k3deploy.errors import InputError

    if target.kind == "ray":
        try:
            from k3deploy.executors.ray_exec import RayExecutor
        except ImportError as exc:
            raise InputError(f"executor 'ray' needs Ray installed here ({exc})",
                             hint="pip install 'k3deploy[ray]' (the cluster's Ray version)") from None
        return RayExecutor(target)

    raise InputError(f"executor '{target.kind}' is not available yet", hint="use --executor ssh or local")
