"""Host-key policies: unknown keys are refused with a how-to, or (opt-in) saved; changed keys never pass."""
from __future__ import annotations

import fcntl
import os
import shlex
import threading

import paramiko

from k3deploy.errors import ExecError
from k3deploy.executors.ssh_config import SshEndpoint

_APPEND_LOCK = threading.Lock()
_CACHE_LOCK = threading.Lock()
_PARSED: dict[str, tuple[tuple[int, int], paramiko.HostKeys]] = {}


def _parsed(path: str) -> paramiko.HostKeys | None:
    """known_hosts parsed once per content (paramiko's own load is quadratic and costs ~20 ms per client)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    with _CACHE_LOCK:
        hit = _PARSED.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
    keys = paramiko.HostKeys(path)
    with _CACHE_LOCK:
        _PARSED[path] = (stamp, keys)
    return keys


def trust_known(client: paramiko.SSHClient, paths: tuple[str, ...], hostname: str, port: int) -> None:
    """Give the client the known keys of this one server, from every known_hosts file."""
    name = hostname if port == 22 else f"[{hostname}]:{port}"  # how paramiko looks the server up
    for path in paths:
        parsed = _parsed(path)
        found = parsed.lookup(name) if parsed is not None else None
        for keytype, key in (found or {}).items():
            client.get_host_keys().add(name, keytype, key)


class UnknownHostKey(paramiko.SSHException):
    """The server's key is not in any known_hosts file."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def _scan_command(ep: SshEndpoint) -> str:
    port = f"-p {ep.port} " if ep.port != 22 else ""
    return f"ssh-keyscan -H {port}{shlex.quote(ep.hostname)} >> {shlex.quote(ep.known_hosts)}"


class RejectUnknownPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse, naming the key's fingerprint and the two ways to trust it."""

    def __init__(self, endpoint: SshEndpoint) -> None:
        self.endpoint = endpoint

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        ep = self.endpoint
        raise UnknownHostKey(
            f"unknown host key for {hostname}: {key.get_name()} {key.fingerprint} is not in {ep.known_hosts}",
            hint=f"verify that fingerprint with the host's administrator, then trust it with\n  "
            f"{_scan_command(ep)}\nor rerun with --accept-new-host-keys (trusts and saves keys never seen "
            "before; a changed key is still refused)",
        )


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust a never-seen key and append it to known_hosts (OpenSSH's StrictHostKeyChecking=accept-new)."""

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line()
        directory = os.path.dirname(self.known_hosts) or "."
        try:
            with _APPEND_LOCK:
                os.makedirs(directory, mode=0o700, exist_ok=True)
                fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a") as fh:
                    fcntl.flock(fh, fcntl.LOCK_EX)  # other k3deploy processes append too
                    fh.write(line)
        except OSError as exc:
            # Not a connection problem: retrying cannot help, and the key must not be trusted unsaved.
            raise UnknownHostKey(f"cannot save the new host key of {hostname} to {self.known_hosts}: "
                                 f"{exc.strerror or exc}",
                                 hint="make known_hosts writable, or name another file with --known-hosts "
                                      "(launch.ssh.known_hosts)") from None


def changed_key_error(host: str, ep: SshEndpoint, exc: paramiko.BadHostKeyException) -> ExecError:
    """A key that differs from the recorded one: maybe a reinstalled host, maybe an attack; never accepted."""
    return ExecError(
        f"HOST KEY CHANGED for {exc.hostname}: it presents {exc.key.get_name()} {exc.key.fingerprint}, "
        f"known_hosts has {exc.expected_key.get_name()} {exc.expected_key.fingerprint}",
        host=host,
        hint="this can be a man-in-the-middle attack; if the host was reinstalled, verify the new "
        f"fingerprint, remove the old entry (ssh-keygen -R {shlex.quote(ep.hostname)} -f "
        f"{shlex.quote(ep.known_hosts)}) and trust the new key; --accept-new-host-keys never overrides this",
    )
