"""Engine kinds: the real engine each one runs or copies (flavour) and whose CLI and rules it follows (family)."""
from __future__ import annotations

from typing import Literal, Protocol

Family = Literal["sglang", "vllm"]
Flavour = Literal["sglang", "vllm", "vllm-ascend"]
# The real engines: catalog engine ids, `plan --search --engine` values. vLLM-Ascend keeps vLLM's CLI.
FLAVOURS: tuple[Flavour, ...] = ("sglang", "vllm", "vllm-ascend")
FAMILY: dict[Flavour, Family] = {"sglang": "sglang", "vllm": "vllm", "vllm-ascend": "vllm"}


class EngineLike(Protocol):
    """The part of a topology's `engine` section that decides the flavour."""

    @property
    def kind(self) -> str: ...


def flavour(kind: str, mimic: str | None = None, vendor: str | None = None) -> Flavour:
    """The real engine: the stand-in (`sim`) is the one it mimics, vLLM-Ascend when it pretends to be on NPUs."""
    if kind == "sim":
        if mimic != "vllm":
            return "sglang"
        return "vllm-ascend" if vendor == "huawei" else "vllm"
    if kind not in FAMILY:
        raise ValueError(f"unknown engine kind {kind!r}")
    return kind


def engine_flavour(engine: EngineLike, vendor: str | None = None) -> Flavour:
    """The flavour of a topology's engine section (`mimic` only exists on the stand-in)."""
    return flavour(engine.kind, getattr(engine, "mimic", None), vendor)


def engine_family(kind: str, mimic: str | None = None) -> Family:
    """sglang | vllm: whose parallel rules, flags and flag table an engine kind gets."""
    return FAMILY[flavour(kind, mimic)]
