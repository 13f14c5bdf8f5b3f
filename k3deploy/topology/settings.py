"""The tuning sections: parallelism, serving, launch and validation settings."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
from typing import Annotated, Literal

from pydantic import Field

from k3deploy.topology.base import PATH_MAX, Strict
from k3deploy.topology.nodes import SshDefaults
from k3deploy.topology.slurm import SlurmSettings


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
    max_running_requests: int | None = Field(
        32, ge=1, description="maximum concurrent requests; null: SGLang admits what its KDA state pool holds "
        "(--max-running-requests not rendered; vLLM needs a number)")
    mem_fraction: float | None = Field(
        None, gt=0, lt=1, description="SGLang --mem-fraction-static / vLLM --gpu-memory-utilization"
    )
    kv_cache_dtype: Literal["bf16", "fp8"] | None = Field(None, description="MLA KV cache dtype")
    state_dtype: Literal["fp32", "bf16"] | None = Field(None, description="KDA SSM state dtype")
    prefix_cache: bool = Field(True, description="prefix caching (SGLang radix cache / vLLM prefix caching)")
    prefix_cache_strategy: Literal["extra_buffer", "extra_buffer_lazy", "no_buffer"] = Field(
        "extra_buffer", description="SGLang --mamba-radix-cache-strategy (KDA slots per request)"
    )
    reasoning_effort: Literal["low", "high", "max"] = Field(
        "max", description="the reasoning effort your traffic asks for: validate's effort stage measures at it "
        "(requests carry it; nothing is rendered, K3 itself defaults to max)")
    images_per_request: int | None = Field(
        None, ge=0, le=1024, description="most images a request may carry: rendered as vLLM --limit-mm-per-prompt / "
        "SGLang --limit-mm-data-per-request; 0 serves text only (vLLM then skips the vision tower: no memory for "
        "it); unset: the engine's default, nothing rendered")
    reserve_gib: float | None = Field(
        None, ge=0, description="runtime reserve per GPU (activations, graphs, buffers); default 8 GiB"
    )
    avg_request_tokens: int | None = Field(
        None, ge=1, description="average request length for SGLang's pool-split formula (default 11264)"
    )
    mamba_full_memory_ratio: Annotated[float, Field(gt=0)] | Literal["calculator"] | None = Field(
        None, description="SGLang --mamba-full-memory-ratio (state pool / KV pool): unset, SGLang's own default "
        "(0.9, not rendered); a number, rendered; 'calculator', the SGLang K3 calculator's ratio from "
        "avg_request_tokens, rendered (`plan` suggests one when the state pool caps max_running_requests)"
    )


class RestartPolicy(Strict):
    """Whole-group restarts after a failure."""

    max: int = Field(0, ge=0, description="restarts before giving up (0 = never restart)")
    backoff_s: float = Field(30.0, ge=0, description="wait before the first restart; doubles each time")


class Launch(Strict):
    """How k3deploy starts and watches the engine."""

    executor: Literal["ssh", "ray", "local", "slurm"] = Field("ssh", description="how commands reach the nodes")
    port: int = Field(20000, ge=1, le=65535, description="rendezvous port on rank 0")
    dist_timeout_s: int = Field(3600, ge=1, description="engine distributed-init timeout")
    ready_timeout_s: int = Field(5400, ge=1, description="deadline for rank 0 to serve /v1/models")
    stop_grace_s: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL grace when stopping")
    ssh: SshDefaults = Field(default_factory=SshDefaults, description="SSH defaults")
    ray_address: str | None = Field(None, description="Ray cluster: auto, ray://host:10001 or host:6379")
    slurm: SlurmSettings = Field(default_factory=SlurmSettings, description="Slurm job settings (executor slurm, "
                                 "render --format slurm)")
    state_dir: str | None = Field(None, description="where deployment records live (default: user state dir)")
    log_dir: str = Field("/tmp/k3deploy", max_length=PATH_MAX, description="directory on each node for engine logs")
    restart: RestartPolicy = Field(default_factory=RestartPolicy, description="restart policy")
    readiness_probe: Literal["auto", "here", "head"] = Field(
        "auto", description="where rank 0's HTTP readiness is checked from: here (this machine), head (on rank 0 "
        "itself, over its executor; needs python3 or curl there), or auto (here when rank 0's ip:port is "
        "reachable from this machine, else head)")

    @property
    def nodes_are_here(self) -> bool:
        """Every node is this machine (executor local): loopback addresses serve, secrets are read here."""
        return nodes_are_here(self.executor)


def nodes_are_here(executor: str) -> bool:
    """Whether an executor setting (launch.executor or --executor) means every node is this machine."""
    return executor == "local"


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
    min_share_of_prediction: float = Field(0.33, ge=0, le=1, description="the effort stage fails a cold "
                                           "workload whose decode speed (1/TPOT) or prefill speed (1/TTFT, when "
                                           "100 ms or more is predicted) is below this share of what `k3deploy "
                                           "plan --workload` predicts for the deployed shape (0: not checked)")
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
    accuracy_dataset: str | None = Field(None, max_length=PATH_MAX, description="the accuracy stage's dataset: JSON "
                                         "lines of {question, answer: A..D}, relative to the topology file "
                                         "(`validate --accuracy-dataset` overrides it; none: the stage skips)")
    accuracy_task: str = Field("k3deploy-recall-mc", min_length=1, description="the task's name: the catalog's "
                               "reference score for the model is looked up under it")
    accuracy_max_tokens: int = Field(16384, ge=16, description="max_tokens of each accuracy request (K3 reasons "
                                     "first, at serving.reasoning_effort; at most half of serving.context_length)")
    accuracy_limit: int | None = Field(None, ge=1, description="evaluate only the first N samples (none: all)")
    shards_timeout_s: float | None = Field(None, gt=0, description="bound on the shards stage per node (default: "
                                           "300 s + checkpoint bytes at 100 MB/s)")
