"""LaunchSpec: what one node runs (argv, env, secret references) and how its readiness looks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from k3deploy.topology.nodes import Node

ReadyKind = Literal["http", "dummy-health", "none"]


@dataclass(frozen=True)
class ReadySpec:
    """How a node shows it is up: rank 0's API server, SGLang workers' dummy /health, or nothing."""

    kind: ReadyKind
    url: str | None = None
    paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchSpec:
    """The exact process one node runs; `env` holds plain values, `secret_env` only references."""

    rank: int
    host: str
    ip: str
    head: bool
    argv: tuple[str, ...]
    env: dict[str, str]
    secret_env: dict[str, str]
    ready: ReadySpec
    container: str | None
    node: Node

    @property
    def headless(self) -> bool:
        """True where the node serves no HTTP at all (vLLM headless workers)."""
        return self.ready.kind == "none"
