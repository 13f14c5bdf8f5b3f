"""Where and how to reach a host over SSH: topology settings merged with the user's ~/.ssh/config."""
from __future__ import annotations

import functools
import getpass
import os
from dataclasses import dataclass
from pathlib import Path

from k3deploy.errors import InputError
from k3deploy.executors.target import SshTarget


@dataclass(frozen=True)
class SshEndpoint:
    """Everything paramiko needs for one host, fully resolved."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    known_hosts: str
    extra_known_hosts: tuple[str, ...]
    jump: tuple[str, ...] = ()  # ProxyJump hops, first to last: [user@]host[:port] or aliases
    proxy_command: str | None = None  # ProxyCommand from ~/.ssh/config (tokens already expanded)

    @property
    def label(self) -> str:
        """user@host:port as people write it."""
        shown = self.alias if self.alias == self.hostname else f"{self.alias} ({self.hostname})"
        return f"{self.user}@{shown}:{self.port}"


def _expand(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(path))


@functools.lru_cache(maxsize=16)
def _config(path: str, stamp: tuple[int, int]) -> object:
    import paramiko

    return paramiko.SSHConfig.from_path(path)


def resolve(target: SshTarget) -> SshEndpoint:
    """Explicit settings (node, then --ssh-* options, then launch.ssh) win over ~/.ssh/config entries."""
    found: dict[str, object] = {}
    if target.ssh_config:
        path = Path(_expand(target.ssh_config))
        if path.is_file():
            import paramiko

            try:
                st = path.stat()
                config = _config(str(path), (st.st_mtime_ns, st.st_size))
                found = dict(config.lookup(target.host))  # type: ignore[attr-defined]
            except (OSError, ValueError, paramiko.SSHException) as exc:  # a broken config is the user's input
                raise InputError(f"cannot read ssh config {path}: {exc}") from exc
    hostname = str(found.get("hostname") or target.host)
    try:
        port = int(target.port or int(str(found.get("port") or 22)))
    except ValueError:
        raise InputError(f"{target.host}: port {found.get('port')!r} in {target.ssh_config} is not a number") from None
    user = target.user or str(found.get("user") or "") or getpass.getuser()
    config_keys = found.get("identityfile") or []
    assert isinstance(config_keys, list)
    keys = (_expand(target.key),) if target.key else tuple(_expand(k) for k in config_keys)
    extra = str(found.get("userknownhostsfile") or "").split()
    known = _expand(target.known_hosts)
    # Like ssh: an explicit jump (-J) wins; else the config's ProxyJump, else its ProxyCommand.
    jump = target.jump if target.jump is not None else str(found.get("proxyjump") or "none")
    command = found.get("proxycommand") if target.jump is None and jump == "none" else None
    return SshEndpoint(
        alias=target.host, hostname=hostname, port=port, user=user, key_files=keys, known_hosts=known,
        extra_known_hosts=tuple(_expand(k) for k in extra if k != "none" and _expand(k) != known),
        jump=() if jump == "none" else tuple(jump.split(",")), proxy_command=str(command) if command else None,
    )  # fmt: skip


def split_hop(hop: str) -> tuple[str | None, str, int | None]:
    """'[user@]host[:port]' (host may be [IPv6]) -> (user, host, port)."""
    user, _, rest = hop.rpartition("@")
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = rest.partition(":")
    return user or None, host, int(port) if port else None
