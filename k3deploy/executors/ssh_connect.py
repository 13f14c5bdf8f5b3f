"""Connecting over SSH (paramiko): the jump chain, host keys checked against known_hosts, bounded retries
with backoff, and a connect that `abort` ends at once; every failure an ExecError naming the host."""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
import threading

import paramiko

from k3deploy.errors import ExecError
from k3deploy.executors.hostkeys import (
    AcceptNewPolicy,
    RejectUnknownPolicy,
    UnknownHostKey,
    changed_key_error,
    trust_known,
)
from k3deploy.executors.jumps import JumpPool
from k3deploy.executors.ssh_config import SshEndpoint, resolve, split_hop
from k3deploy.executors.target import SshTarget
from k3deploy.executors.tcp import open_socket

# How often an idle connection's reader thread wakes to see whether it was closed (data wakes it at once).
IDLE_WAKE_S = 1.0

# Retried: the network or an overloaded sshd. Never retried: authentication and host keys.
CONNECT_ATTEMPTS = 3
BACKOFF_S = (0.5, 1.5)
RETRYABLE = (OSError, EOFError, paramiko.SSHException)

if not os.environ.get("K3DEPLOY_DEBUG"):
    # paramiko logs every failed handshake at ERROR with a traceback; we report it once, translated.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class SshConnector:
    """Makes the authenticated connection to one node (through its jump hosts); `abort` from another thread
    ends a connect under way now, not after every attempt's timeout (Ctrl-C, a teardown)."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self.host = target.host
        self._endpoint: SshEndpoint | None = None
        self._hop_keys: list[tuple[object, ...]] = []  # shared jump-host connections this one runs through
        self._abort = threading.Event()
        self._handshaking: set[paramiko.SSHClient] = set()
        self._handshaking_lock = threading.Lock()

    @property
    def endpoint(self) -> SshEndpoint:
        """Resolved address, user, keys (reads ~/.ssh/config once)."""
        if self._endpoint is None:
            self._endpoint = resolve(self.target)
        return self._endpoint

    def connect(self) -> paramiko.SSHClient:
        """The chain of jump hosts (if any), then the node; every attempt retries the whole chain."""
        ep, t = self.endpoint, self.target
        chain = [*(self._hop(spec) for spec in ep.jump), ep]
        last: Exception | None = None
        where = chain[0]
        for attempt in range(CONNECT_ATTEMPTS):
            if attempt and self._abort.wait(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)]):
                break
            self.release_hops()
            via: paramiko.SSHClient | None = None
            try:
                for i, step in enumerate(chain):
                    where = step
                    if step is ep:
                        return self._handshake(step, via)
                    key = (tuple(chain[: i + 1]), t.accept_new_host_keys)
                    via = JUMPS.acquire(key, functools.partial(self._handshake, step, via))
                    self._hop_keys.append(key)
            except ExecError:
                self.release_hops()
                raise
            except RETRYABLE as exc:
                last = exc
            if self._abort.is_set():
                break
        self.release_hops()
        if self._abort.is_set():
            raise ExecError(f"connecting to {self._label(where)} was given up: the connection was closed",
                            host=self.host)
        direct = not ep.jump and not ep.proxy_command
        raise ExecError(f"cannot connect to {self._label(where)} after {CONNECT_ATTEMPTS} attempts "
                        f"(timeout {t.connect_timeout_s:g} s each): {describe(last)}", host=self.host,
                        hint="a node reachable only through a bastion needs launch.ssh.jump, --ssh-jump or "
                             "ProxyJump in ~/.ssh/config" if direct else None) from None

    def _hop(self, spec: str) -> SshEndpoint:
        """A jump host's endpoint: its own ~/.ssh/config entry; without an IdentityFile there, the node's key."""
        user, host, port = split_hop(spec)
        t = self.target
        hop = resolve(SshTarget(host=host, user=user, port=port, known_hosts=t.known_hosts,
                                 ssh_config=t.ssh_config, accept_new_host_keys=t.accept_new_host_keys,
                                 connect_timeout_s=t.connect_timeout_s, jump="none"))
        if not hop.key_files and self.endpoint.key_files:
            hop = dataclasses.replace(hop, key_files=self.endpoint.key_files)
        return hop

    def _label(self, step: SshEndpoint) -> str:
        if step is self.endpoint:
            return step.label
        return f"jump host {step.label} (on the way to {self.endpoint.label})"

    def _handshake(self, step: SshEndpoint, via: paramiko.SSHClient | None) -> paramiko.SSHClient:
        """Connect and authenticate to one endpoint: directly, through `via`'s connection, or through the
        config's ProxyCommand; errors that a retry cannot fix become ExecErrors naming the step."""
        t = self.target
        client = paramiko.SSHClient()
        with self._handshaking_lock:
            self._handshaking.add(client)
        try:
            trust_known(client, (*step.extra_known_hosts, step.known_hosts), step.hostname, step.port)
            policy = AcceptNewPolicy(step.known_hosts) if t.accept_new_host_keys else RejectUnknownPolicy(step)
            client.set_missing_host_key_policy(policy)
            pkey = _load_key(step.key_files[0]) if len(step.key_files) == 1 else None
            sock = self._sock(step, via)
            if self._abort.is_set():
                sock.close()
                raise paramiko.SSHException("closed while connecting")
            client.connect(
                step.hostname, port=step.port, username=step.user, pkey=pkey, sock=sock,
                key_filename=None if pkey is not None else list(step.key_files) or None,
                timeout=t.connect_timeout_s, banner_timeout=t.connect_timeout_s,
                auth_timeout=t.connect_timeout_s, allow_agent=True, look_for_keys=not step.key_files,
            )  # fmt: skip
            transport = client.get_transport()
            if transport is not None:
                # paramiko's reader thread wakes every 0.1 s to check for a close; across the connections a
                # supervisor keeps open for days that is most of its CPU. Data still wakes it at once.
                transport.sock.settimeout(IDLE_WAKE_S)
            return client
        except UnknownHostKey as exc:
            client.close()
            raise ExecError(str(exc), host=self.host, hint=exc.hint) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise changed_key_error(self.host, step, exc) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            keys = ", ".join(step.key_files) or "agent and ~/.ssh/id_*"
            raise ExecError(f"authentication failed as {step.user} at {self._label(step)} ({keys}): {exc}",
                            host=self.host, hint="check the user and key (node ssh:, launch.ssh, "
                            "--ssh-user/--ssh-key; a jump host's own in ~/.ssh/config or user@ in the hop)") from None
        except socket.gaierror as exc:
            client.close()
            raise ExecError(f"cannot resolve {step.hostname} ({self._label(step)}): {exc.strerror}",
                            host=self.host) from None
        except RETRYABLE:
            client.close()
            raise
        finally:
            with self._handshaking_lock:
                self._handshaking.discard(client)

    def _sock(self, step: SshEndpoint,
              via: paramiko.SSHClient | None) -> socket.socket | paramiko.Channel | paramiko.ProxyCommand:
        t = self.target
        if via is not None:
            transport = via.get_transport()
            if transport is None:
                raise paramiko.SSHException("the jump host closed the connection")
            # The jump host opens the TCP connection: the node's name or address is resolved there.
            return transport.open_channel("direct-tcpip", (step.hostname, step.port), ("127.0.0.1", 0),
                                          timeout=t.connect_timeout_s)
        if step.proxy_command:
            return paramiko.ProxyCommand(step.proxy_command)
        return open_socket(step.hostname, step.port, t.connect_timeout_s)

    def release_hops(self) -> None:
        """Let go of the shared jump-host connections this one ran through."""
        for key in reversed(self._hop_keys):
            JUMPS.release(key)
        self._hop_keys.clear()

    def abort(self) -> None:
        """End a connect under way in another thread: the clients still in their handshake are closed."""
        self._abort.set()
        with self._handshaking_lock:
            pending = list(self._handshaking)
        for client in pending:
            client.close()  # its transport stops: the handshake fails within paramiko's 0.1 s poll

    def rearm(self) -> None:
        """After `abort` and the close: the node may be connected again later."""
        self._abort.clear()


_KEYS: dict[str, paramiko.PKey | None] = {}


def _load_key(path: str) -> paramiko.PKey | None:
    """A private key read once per process; None (let paramiko try, e.g. for a passphrase) if unreadable."""
    if path not in _KEYS:
        try:
            _KEYS[path] = paramiko.PKey.from_path(path)
        except (OSError, ValueError, paramiko.SSHException):
            _KEYS[path] = None
    return _KEYS[path]


def active(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


# Every node behind the same jump chain (in this process) rides one connection to each hop.
JUMPS = JumpPool(active)


def describe(exc: BaseException | None) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError | paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if exc is None:
        return "unknown error"
    return str(exc) or type(exc).__name__
