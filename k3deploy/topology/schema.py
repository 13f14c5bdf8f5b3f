"""The topology file schema: one strict, frozen pydantic model per section."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Host names, ssh aliases and interface names go into shell commands and env: accept only what a real
# one can contain, so a hostile value is rejected at load time rather than quoted later.
HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.:-]{0,252})$")
IFACE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# One ProxyJump hop: [user@]host[:port], host a name, alias, IPv4 or [IPv6].
JUMP_HOP_RE = re.compile(r"^([a-z_][a-z0-9_.-]{0,31}@)?([A-Za-z0-9_][A-Za-z0-9_.-]{0,252}|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$")
SECRET_REF_RE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:/[^\x00\n]*)$")
# Linux's PATH_MAX: a longer path can be opened on no node (and a log path repeated in the start script
# would pass the kernel's 128 KiB limit on one argument long before that).
PATH_MAX = 4096


class Strict(BaseModel):
    """Unknown keys are errors; values are immutable after load."""

    # Sections are built as part of Topology on its first validation, not each on its own at import.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class ModelRef(Strict):
    """Which checkpoint, where it lives on every node, and which revision."""

    id: str = Field(description="model catalog id, e.g. kimi-k3, kimi-k3-w4a8, kimi-k3-tiny")
    path: str = Field(max_length=PATH_MAX,
                      description="absolute path of the checkpoint on every node (identical everywhere)")
    revision: str | None = Field(None, description="pinned hub revision (commit sha) of the checkpoint")

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or "\x00" in v or "\n" in v:
            raise ValueError("must be an absolute path without NUL or newline")
        return v


class HardwareRef(Strict):
    """Which accelerator, and how many per node."""

    gpu: str = Field(description="hardware catalog id, e.g. h100-80gb, b200, mi355x, ascend-a3, sim")
    gpus_per_node: int = Field(ge=1, le=64, description="accelerators per node used by the engine")


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


ArgValue = str | int | float | bool | None | list[str | int | float]


class EngineBase(Strict):
    """Settings shared by every engine kind."""

    version: str | None = Field(None, description="engine version the flags are rendered for")
    image: str | None = Field(None, description="container image; when set the command runs in docker")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the head node's API server")
    args: dict[str, ArgValue] = Field(
        default_factory=dict,
        description="extra engine flags, e.g. {'--enable-symm-mem': true}; true renders a bare flag, "
        "null or false omits it",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for every node")
    secrets: dict[str, str] = Field(
        default_factory=dict,
        description="secret env vars passed by reference: 'env:NAME' (from the node's environment) or "
        "'file:/path' (read on the node); values never appear in rendered output",
    )
    launcher: list[str] | None = Field(
        None,
        description="argv prefix replacing the engine executable, e.g. ['/opt/venv/bin/sglang', 'serve']",
    )

    @field_validator("env", "secrets")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not ENV_NAME_RE.fullmatch(k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {bad}")
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_refs(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k, ref in v.items() if not SECRET_REF_RE.fullmatch(ref)]
        if bad:
            raise ValueError(f"secrets {bad}: a secret is a reference, 'env:NAME' or 'file:/abs/path'")
        return v

    @field_validator("args")
    @classmethod
    def _flag_names(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        bad = [k for k in v if not re.fullmatch(r"--?[A-Za-z0-9][A-Za-z0-9-]*", k)]
        if bad:
            raise ValueError(f"engine args must be flags like '--name': {bad}")
        return v


class SglangEngine(EngineBase):
    """SGLang (`sglang serve`)."""

    kind: Literal["sglang"] = Field(description="engine kind")


class VllmEngine(EngineBase):
    """vLLM (`vllm serve`)."""

    kind: Literal["vllm"] = Field(description="engine kind")


class VllmAscendEngine(EngineBase):
    """vLLM with the vLLM-Ascend plugin on Huawei NPUs."""

    kind: Literal["vllm-ascend"] = Field(description="engine kind")


class SimEngine(EngineBase):
    """The stand-in engine (k3deploy.sim) mimicking SGLang or vLLM, for tests and demos."""

    kind: Literal["sim"] = Field(description="engine kind")
    mimic: Literal["sglang", "vllm"] = Field("sglang", description="whose flags and behaviour to mimic")


Engine = Annotated[
    SglangEngine | VllmEngine | VllmAscendEngine | SimEngine, Field(discriminator="kind")
]


class Parallel(Strict):
    """Parallelism; world size follows the engine's own rules (see `k3deploy plan`)."""

    tp: int = Field(1, ge=1, description="tensor parallel size")
    ep: int = Field(1, ge=1, description="expert parallel size (1 = experts tensor-sharded)")
    dp: int = Field(1, ge=1, description="data parallel size (SGLang: attention DP groups inside TP)")
    pp: int = Field(1, ge=1, description="pipeline parallel size")
    dcp: int = Field(1, ge=1, description="decode-context parallel size (shards the MLA KV cache)")
    attention_dp: bool = Field(False, description="SGLang DP attention: attn_tp = tp / dp")


class Serving(Strict):
    """What the engine serves and how its memory is split."""

    context_length: int = Field(131072, ge=1, description="maximum tokens per request")
    max_running_requests: int = Field(32, ge=1, description="maximum concurrent requests")
    mem_fraction: float | None = Field(
        None, gt=0, lt=1, description="SGLang --mem-fraction-static / vLLM --gpu-memory-utilization"
    )
    kv_cache_dtype: Literal["bf16", "fp8"] | None = Field(None, description="MLA KV cache dtype")
    state_dtype: Literal["fp32", "bf16"] | None = Field(None, description="KDA SSM state dtype")
    prefix_cache: bool = Field(True, description="prefix caching (SGLang radix cache / vLLM prefix caching)")
    prefix_cache_strategy: Literal["extra_buffer", "extra_buffer_lazy", "no_buffer"] = Field(
        "extra_buffer", description="SGLang --mamba-radix-cache-strategy (KDA slots per request)"
    )
    reasoning_effort: Literal["low", "high", "max"] = Field("max", description="default reasoning effort")
    reserve_gib: float | None = Field(
        None, ge=0, description="runtime reserve per GPU (activations, graphs, buffers); default 8 GiB"
    )
    avg_request_tokens: int | None = Field(
        None, ge=1, description="average request length for SGLang's pool-split formula (default 11264)"
    )
    mamba_full_memory_ratio: float | None = Field(
        None, gt=0, description="SGLang state/KV pool ratio; default: computed by the planner"
    )


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


class RestartPolicy(Strict):
    """Whole-group restarts after a failure."""

    max: int = Field(0, ge=0, description="restarts before giving up (0 = never restart)")
    backoff_s: float = Field(30.0, ge=0, description="wait before the first restart; doubles each time")


class Launch(Strict):
    """How k3deploy starts and watches the engine."""

    executor: Literal["ssh", "ray", "local"] = Field("ssh", description="how commands reach the nodes")
    port: int = Field(20000, ge=1, le=65535, description="rendezvous port on rank 0")
    dist_timeout_s: int = Field(3600, ge=1, description="engine distributed-init timeout")
    ready_timeout_s: int = Field(5400, ge=1, description="deadline for rank 0 to serve /v1/models")
    stop_grace_s: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL grace when stopping")
    ssh: SshDefaults = Field(default_factory=SshDefaults, description="SSH defaults")
    ray_address: str | None = Field(None, description="Ray cluster: auto, ray://host:10001 or host:6379")
    state_dir: str | None = Field(None, description="where deployment records live (default: user state dir)")
    log_dir: str = Field("/tmp/k3deploy", max_length=PATH_MAX, description="directory on each node for engine logs")
    restart: RestartPolicy = Field(default_factory=RestartPolicy, description="restart policy")
    readiness_probe: Literal["auto", "here", "head"] = Field(
        "auto", description="where rank 0's HTTP readiness is checked from: here (this machine), head (on rank 0 "
        "itself, over its executor; needs python3 or curl there), or auto (here when rank 0's ip:port is "
        "reachable from this machine, else head)")


class ValidateSettings(Strict):
    """Thresholds for `k3deploy validate`."""

    long_request_tokens: int | None = Field(None, ge=1, description="prompt tokens of the long stage's request "
                                            "(default: long_request_fraction of serving.context_length)")
    long_request_fraction: float = Field(0.9, gt=0, le=1, description="the long request's share of "
                                         "serving.context_length when long_request_tokens is not set")
    answer_max_tokens: int = Field(2048, ge=16, description="max_tokens of the long and prefix-cache requests "
                                   "(K3 reasons first; asked at low effort); kept free of the context")
    short_max_tokens: int = Field(2048, ge=1, description="max_tokens of the short stage's requests (a short "
                                  "question at low effort thinks for far fewer)")
    retrieval_depths: list[float] = Field([0.1, 0.5, 0.9], min_length=1, description="where facts are planted "
                                          "in the long and prefix-cache prompts (0 = start, 1 = end)")
    prefix_cache_tokens: int = Field(8192, ge=1, description="shared prefix of the prefix-cache stage's "
                                     "conversation (well past the hash block)")
    cache_block_tokens: int = Field(512, ge=1, description="the engine's prefix-cache hash block (K3's design: "
                                    "512; vLLM --prefix-match-unit changes it): hits land on its multiples")
    min_cache_hit_ratio: float = Field(0.5, ge=0, le=1, description="minimum cached/prompt on turn 2")
    min_throughput_tok_s: float = Field(0.0, ge=0, description="minimum output tokens/s of each effort workload")
    max_p99_ttft_s: float | None = Field(None, gt=0, description="maximum p99 time to first token in the effort "
                                         "stage (none: not checked)")
    max_mean_tpot_ms: float | None = Field(None, gt=0, description="maximum mean time per output token in the "
                                           "effort stage (none: not checked)")
    concurrency: int = Field(8, ge=1, description="concurrent requests in the effort stage")
    effort_requests: int | None = Field(None, ge=1, description="requests per effort workload (default: 2 x "
                                        "concurrency)")
    effort_prompt_tokens: int = Field(1024, ge=16, description="approximate prompt tokens of each effort request "
                                      "(at least 2 x cache_block_tokens, so that the shared prefix can hit)")
    effort_max_tokens: int = Field(2048, ge=1, description="max_tokens of each effort request (bounds the run)")
    effort_via: Literal["auto", "reasoning_effort", "chat_template_kwargs"] = Field(
        "auto", description="how requests ask for serving.reasoning_effort: top-level reasoning_effort, "
        "chat_template_kwargs.thinking_effort, or auto (SGLang: the first, vLLM: the second)")
    request_timeout_s: float = Field(600.0, gt=0, description="per-request timeout")
    manifest: str | None = Field(None, description="checkpoint manifest (`k3deploy manifest create/from-hub`) the "
                                 "shards stage checks every node against; relative to the topology file")
    shards_timeout_s: float | None = Field(None, gt=0, description="bound on the shards stage per node (default: "
                                           "300 s + checkpoint bytes at 100 MB/s)")


class Topology(Strict):
    """A Kimi K3 deployment: model, hardware, nodes, engine, parallelism, serving, launch."""

    name: str = Field(description="deployment name (letters, digits, - _ .)", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    model: ModelRef = Field(description="the checkpoint")
    hardware: HardwareRef = Field(description="accelerator type and count per node")
    nodes: list[Node] = Field(min_length=1, description="nodes; rank = list order unless `rank` is set")
    engine: Engine = Field(description="serving engine")
    parallel: Parallel = Field(default_factory=Parallel, description="parallelism")
    serving: Serving = Field(default_factory=Serving, description="serving and memory settings")
    launch: Launch = Field(default_factory=Launch, description="launch settings")
    validate_: ValidateSettings = Field(
        default_factory=ValidateSettings, alias="validate", description="validation thresholds"
    )

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, populate_by_name=True)

    def ordered_nodes(self) -> list[tuple[int, Node]]:
        """Nodes with their rank, rank 0 first."""
        ranked = [(n.rank if n.rank is not None else i, n) for i, n in enumerate(self.nodes)]
        return sorted(ranked, key=lambda rn: rn[0])
