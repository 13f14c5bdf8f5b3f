"""The router section: which real router fronts the replicas, where it runs, and its health settings."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
from typing import Literal

from pydantic import Field, field_validator

from k3deploy.topology.base import Strict
from k3deploy.topology.nodes import HOST_RE

RouterKind = Literal["smg", "sglang-router", "vllm-router"]
# Which routers speak to which engine's workers: the SGLang Model Gateway (smg, and its older name
# sglang-router) asks SGLang's worker API; vllm-router is its fork for vLLM's. The stand-in follows its mimic.
ROUTERS_FOR_ENGINE: dict[str, tuple[str, ...]] = {
    "sglang": ("smg", "sglang-router"), "vllm": ("vllm-router",), "vllm-ascend": ("vllm-router",)}


def routers_for(engine_kind: str, mimic: str | None) -> tuple[str, ...]:
    """The router kinds that can front this engine."""
    return ROUTERS_FOR_ENGINE[mimic or "sglang"] if engine_kind == "sim" else ROUTERS_FOR_ENGINE[engine_kind]


class Router(Strict):
    """The router in front of the replicas (a real one from PyPI: smg, sglang-router or vllm-router)."""

    kind: RouterKind = Field(description="smg (SGLang Model Gateway) or sglang-router for SGLang replicas, "
                             "vllm-router for vLLM replicas")
    runs_on: str = Field("local", description="where the router runs: `local` (the host running k3deploy) or "
                         "the `host` of one of the nodes")
    port: int = Field(30000, ge=1, le=65535, description="the router's HTTP port (what clients call)")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="the router's Prometheus exporter port "
                                     "(default: port + 1; the routers' own default, 29000 on every address, "
                                     "collides with any second router on the machine)")
    listen: str | None = Field(None, description="address the router binds (default: 127.0.0.1 on local, "
                               "the node's ip on a node)")
    python: str = Field("python3", description="the interpreter that has the router installed, on the machine "
                        "the router runs on (it starts as `PYTHON -m <router module>`)")
    policy: str = Field("cache_aware", description="routing policy (one of the router's --policy choices); "
                        "cache_aware keeps a conversation on the replica holding its prefix")
    health_failure_threshold: int = Field(3, ge=1, description="consecutive failed health checks before a "
                                          "replica is taken out")
    health_success_threshold: int = Field(2, ge=1, description="consecutive passed health checks before a "
                                          "replica is put back")
    health_check_interval_s: int = Field(10, ge=1, description="seconds between health checks")
    health_check_timeout_s: int | None = Field(
        None, ge=1, description="health-check timeout; default: sized by the plan above the longest prefill "
        "a replica allows (a health check waits behind a running prefill)")
    startup_timeout_s: int | None = Field(
        None, ge=1, description="how long the router waits for a replica to come up; default: sized by the "
        "plan above launch.ready_timeout_s (the load time the deployment allows)")

    @property
    def metrics_port_or_default(self) -> int:
        """The metrics port the router is given (port + 1 unless set)."""
        return self.metrics_port if self.metrics_port is not None else self.port + 1

    @property
    def metrics_path(self) -> str:
        """Where a metrics-port problem is located: the field when set, else the port it derives from."""
        return "router.metrics_port" if self.metrics_port is not None else "router.port"

    @field_validator("runs_on")
    @classmethod
    def _runs_on(cls, v: str) -> str:
        if v != "local" and not HOST_RE.fullmatch(v):
            raise ValueError("`local` or a node's host name")
        return v

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        import ipaddress

        if v is None:
            return v
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError("must be an IP address") from None
