"""The nodes section and SSH settings: how each node is reached and which private IP and interface it uses."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
import re

from pydantic import Field, field_validator

from k3deploy.topology.base import Strict

# Host names, ssh aliases and interface names go into shell commands and env: accept only what a real
# one can contain, so a hostile value is rejected at load time rather than quoted later.
HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.:-]{0,252})$")
IFACE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}$")
# One ProxyJump hop: [user@]host[:port], host a name, alias, IPv4 or [IPv6].
JUMP_HOP_RE = re.compile(r"^([a-z_][a-z0-9_.-]{0,31}@)?([A-Za-z0-9_][A-Za-z0-9_.-]{0,252}|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$")


class SshOptions(Strict):
    """Per-node SSH settings; unset values fall back to launch.ssh, then ~/.ssh/config."""

    user: str | None = Field(None, description="login user")
    port: int | None = Field(None, ge=1, le=65535, description="sshd port")
    key: str | None = Field(None, description="private key file (~ expands on the machine running k3deploy)")
    jump: str | None = Field(None, description="jump host(s) to reach this node through, like ssh's ProxyJump: "
                             "[user@]host[:port], comma-separated for a chain; 'none' ignores ~/.ssh/config's")

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", v):
            raise ValueError("not a valid login name (lowercase letters, digits, _ . -)")
        return v

    @field_validator("jump")
    @classmethod
    def _jump(cls, v: str | None) -> str | None:
        return check_jump(v)


def check_jump(v: str | None) -> str | None:
    """A ProxyJump value: 'none', or comma-separated [user@]host[:port] hops (each port 1..65535)."""
    if v is None or v == "none":
        return v
    for hop in v.split(","):
        m = JUMP_HOP_RE.fullmatch(hop)
        if not m or (m.group(3) and not 1 <= int(m.group(3)[1:]) <= 65535):
            raise ValueError(f"jump hop {hop!r} is not [user@]host[:port] (hops separated by commas, no spaces)")
    return v


class Node(Strict):
    """One node: how to reach it, and which private IP and interface carry the collectives."""

    host: str = Field(description="SSH address: hostname, ~/.ssh/config alias, or IP")
    ip: str = Field(description="private IP used for rendezvous and collectives (on `iface`)")
    iface: str = Field(description="private interface name (NCCL/GLOO_SOCKET_IFNAME), e.g. ens-priv")
    ssh: SshOptions | None = Field(None, description="per-node SSH overrides")
    rank: int | None = Field(None, ge=0, description="explicit node rank; default is list order")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not HOST_RE.fullmatch(v):
            raise ValueError("not a valid host name, alias or IP (letters, digits, . - _ : only)")
        return v

    @field_validator("ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        import ipaddress

        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError("must be an IP address (rendezvous never goes through DNS)") from None

    @field_validator("iface")
    @classmethod
    def _iface(cls, v: str) -> str:
        if not IFACE_RE.fullmatch(v):
            raise ValueError("not a valid interface name (at most 15 of letters, digits, _ . - : @)")
        return v


class SshDefaults(Strict):
    """SSH defaults for every node."""

    user: str | None = Field(None, description="login user")
    key: str | None = Field(None, description="private key file")
    known_hosts: str = Field("~/.ssh/known_hosts", description="known_hosts file checked for host keys")
    connect_timeout_s: float = Field(10.0, gt=0, description="TCP + SSH handshake timeout per attempt")
    jump: str | None = Field(None, description="jump host(s) for every node (a node's ssh.jump wins), like ssh's "
                             "ProxyJump: [user@]host[:port], comma-separated; 'none' ignores ~/.ssh/config's")

    @field_validator("jump")
    @classmethod
    def _jump(cls, v: str | None) -> str | None:
        return check_jump(v)
