"""How to reach one node (which executor, with what settings), one model per executor kind, and what that
executor can do (its capabilities): JSON-able, so a supervisor can reopen it from the state file."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ExecutorKind = Literal["local", "ssh", "ray", "slurm"]


@dataclass(frozen=True)
class Capabilities:
    """What an executor does, so callers ask this instead of which kind it is (tests/executor_contract.py
    checks each against the executor's behaviour)."""

    streams_logs: bool  # `follow` yields lines as they are written; False: watch by polling alive/read_log
    node_is_here: bool  # the node is this machine: its processes can run under this very interpreter
    forwards_ports: bool  # `forward` returns a local endpoint; False: HTTP checks run on the node itself
    ray_runtime: bool  # commands run as Ray workers: Ray and Python must be the same on every node
    # The nodes are a batch job's that launch submits (Slurm): the job starts the engines, launch finds them.
    runs_in_job: bool = False


class _Target(BaseModel):
    """Fields every kind has."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capabilities: ClassVar[Capabilities]
    host: str = Field(description="host as the topology names it (address or ~/.ssh/config alias)")

    @model_validator(mode="before")
    @classmethod
    def _drop_other_kinds(cls, data: Any) -> Any:
        # Records before 0.3 held one flat target with every kind's fields, as the launch settings hold every
        # kind's options (nodeplan.targets): each kind keeps its own; a field no kind has is still refused.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k in cls.model_fields or k not in _FLAT_FIELDS}
        return data


class LocalTarget(_Target):
    """The node is this machine."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        streams_logs=True, node_is_here=True, forwards_ports=True, ray_runtime=False)
    kind: Literal["local"] = Field("local", description="executor implementation")

    def via(self) -> str:
        """How the node is reached, in words (for display)."""
        return "local"


class SshTarget(_Target):
    """A node reached over SSH (paramiko), host keys checked."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        streams_logs=True, node_is_here=False, forwards_ports=True, ray_runtime=False)
    kind: Literal["ssh"] = Field("ssh", description="executor implementation")
    user: str | None = Field(None, description="login user (else ~/.ssh/config, else the local user)")
    port: int | None = Field(None, description="port (else ~/.ssh/config, else 22)")
    key: str | None = Field(None, description="private key file (else ~/.ssh/config, agent, ~/.ssh/id_*)")
    known_hosts: str = Field("~/.ssh/known_hosts", description="known_hosts file checked (and extended)")
    ssh_config: str | None = Field("~/.ssh/config", description="client config file for aliases")
    accept_new_host_keys: bool = Field(False, description="trust and save unknown host keys")
    connect_timeout_s: float = Field(10.0, gt=0, description="TCP + handshake timeout per attempt")
    jump: str | None = Field(None, description="jump hosts ([user@]host[:port],...), 'none', or None for "
                             "~/.ssh/config's ProxyJump")

    def via(self) -> str:
        """`ssh user@host:port through JUMP`, the parts that are set."""
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        jump = f" through {self.jump}" if self.jump and self.jump != "none" else ""
        return f"ssh {user}{self.host}{port}{jump}"


class RayTarget(_Target):
    """A node reached through an existing Ray cluster (placed by its IP)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        streams_logs=False, node_is_here=False, forwards_ports=False, ray_runtime=True)
    kind: Literal["ray"] = Field("ray", description="executor implementation")
    ray_address: str | None = Field(None, description="cluster address (auto, HOST:6379, ray://HOST:10001)")
    node_ip: str | None = Field(None, description="the node's `ip`, matched against the IPs of Ray's nodes")

    def via(self) -> str:
        """How the node is reached, in words (for display)."""
        return f"ray {self.ray_address or 'auto'}"


class SlurmTarget(_Target):
    """A node of a Slurm allocation, reached by job steps (`srun --overlap`) from this machine."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        streams_logs=True, node_is_here=False, forwards_ports=False, ray_runtime=False, runs_in_job=True)
    kind: Literal["slurm"] = Field("slurm", description="executor implementation")
    job_id: int | None = Field(None, description="the allocation's job id (set once the job is submitted)")
    slurm_conf: str | None = Field(None, description="slurm.conf for the clients (SLURM_CONF), else Slurm's own")

    def via(self) -> str:
        """How the node is reached, in words (for display)."""
        return f"slurm job {self.job_id}" if self.job_id is not None else "slurm"


# One model per executor kind; the `kind` field picks it.
ExecTarget = Annotated[LocalTarget | SshTarget | RayTarget | SlurmTarget, Field(discriminator="kind")]
_FLAT_FIELDS = frozenset(set(SshTarget.model_fields) | set(RayTarget.model_fields) | set(SlurmTarget.model_fields))
