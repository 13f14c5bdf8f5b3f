"""Stand-in nodes as local processes on loopback addresses (127.0.0.x), for tests and the demo.

Each node is its own process group, so stopping a node stops everything it started.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import Self

from k3deploy.sim.rendezvous import free_port

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.05


class NodeTimeout(AssertionError):
    """A node did not log what was expected in time (the message carries the log tail)."""


@dataclass
class SimNode:
    """One running `python -m k3deploy.sim serve` process and its combined stdout+stderr log."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        """The process id (also its process-group id)."""
        return self.popen.pid

    def text(self) -> str:
        """The whole log so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def _tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Block until the log matches pattern (regex); fail early if the process exits first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = regex.search(self.text())
            if match:
                return match
            if self.popen.poll() is not None:
                match = regex.search(self.text())  # it may have logged the line just before exiting
                if match:
                    return match
                raise NodeTimeout(
                    f"{self.name} exited ({self.popen.returncode}) before /{pattern}/:\n{self._tail()}"
                )
            time.sleep(POLL_S)
        raise NodeTimeout(f"{self.name}: no /{pattern}/ within {timeout_s} s:\n{self._tail()}")

    def wait_exit(self, timeout_s: float) -> int:
        """The exit status, waiting at most timeout_s."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise NodeTimeout(f"{self.name} still running after {timeout_s} s:\n{self._tail()}") from exc

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the node's whole process group; reap it after SIGKILL."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGKILL:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def start_node(
    name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> SimNode:
    """Start `python -m k3deploy.sim serve ARGV` in a new session with its output in log_path."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), full_env.get("PYTHONPATH")]))
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "k3deploy.sim", "serve", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )
    return SimNode(name=name, popen=popen, log_path=log_path)


def node_ip(rank: int) -> str:
    """Loopback address of node rank (127.0.0.1 for the head)."""
    return f"127.0.0.{rank + 1}"


def sglang_node_argv(
    model_path: Path | str,
    *,
    rank: int,
    nnodes: int,
    dist_port: int,
    http_port: int,
    timeout_s: int = 30,
    extra: Sequence[str] = (),
) -> list[str]:
    """The SGLang command line k3deploy renders for node `rank` of a loopback cluster (tp = nnodes)."""
    return [
        "--mimic",
        "sglang",
        str(model_path),
        "--tp-size",
        str(nnodes),
        "--ep-size",
        str(nnodes),
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(rank),
        "--dist-init-addr",
        f"{node_ip(0)}:{dist_port}",
        "--dist-timeout",
        str(timeout_s),
        "--host",
        "0.0.0.0",
        "--port",
        str(http_port),
        *extra,
    ]


def node_env(mimic: str, rank: int, ifname: str = "lo", **extra: str) -> dict[str, str]:
    """Per-node env as k3deploy renders it: own IP, Gloo/NCCL interface."""
    ip_var = "SGLANG_HOST_IP" if mimic == "sglang" else "VLLM_HOST_IP"
    return {ip_var: node_ip(rank), "GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname, **extra}


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on loopback."""
    ports: list[int] = []
    for _ in range(count * 10):
        port = free_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError("could not find free ports")


class NodeSet:
    """Nodes started together; closing it SIGKILLs every node's process group."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.nodes: list[SimNode] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimNode:
        """Start one more node, logging to LOG_DIR/NAME.log."""
        node = start_node(name, argv, self.log_dir / f"{name}.log", env)
        self.nodes.append(node)
        return node

    def close(self) -> None:
        """Kill and reap every node."""
        for node in self.nodes:
            node.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
