"""The engine section: a discriminated union on `kind`, with the settings every engine shares."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from k3deploy.topology.base import Strict

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_REF_RE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:/[^\x00\n]*)$")

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
