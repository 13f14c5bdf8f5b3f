"""How to reach one node (which executor, with what settings): JSON-able, so a supervisor can reopen it."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
