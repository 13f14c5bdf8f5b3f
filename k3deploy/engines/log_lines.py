"""The start-up log lines validate reads, per pinned engine version (engines/data/log-lines.yaml)."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from k3deploy.engines.flag_tables import DATA_DIR
from k3deploy.engines.kinds import Family

LOG_LINES_FILE = DATA_DIR / "log-lines.yaml"
# The flag tables pin these versions; the log lines are read off the same releases.
VERSIONS: dict[Family, str] = {"sglang": "sglang 0.5.23", "vllm": "vllm 0.33.0"}
# vLLM-Ascend's graph-mode lines: the revision they were read off (seed 004 names main, not a tag).
ASCEND_VERSION = "vllm-ascend main@182b75ea84"


@dataclass(frozen=True)
class LogLines:
    """One engine version's patterns, compiled (case-insensitive)."""

    version: str
    moe: tuple[re.Pattern[str], ...]
    attention: tuple[re.Pattern[str], ...]
    fallback: tuple[re.Pattern[str], ...]
    marlin_warning: tuple[re.Pattern[str], ...]
    rank_prefix: re.Pattern[str]
    args: re.Pattern[str]
    world: re.Pattern[str] | None
    experts: re.Pattern[str] | None
    rank_line: re.Pattern[str] | None  # any rank-assignment line, read by rank_prefix or not
    prefix_cache_off: tuple[re.Pattern[str], ...]  # the engine turned its prefix cache off itself
    moe_kinds: dict[str, frozenset[str]]

    def moe_kind(self, name: str) -> str:
        """marlin | native_mxfp4 | upcast: what a MoE kernel does with MXFP4 experts."""
        return next((kind for kind, names in self.moe_kinds.items() if name.lower() in names), "upcast")


@dataclass(frozen=True)
class GraphLines:
    """vLLM-Ascend's lines about its ACL graphs: captured, or decode left eager."""

    version: str
    captured: re.Pattern[str]
    off: tuple[re.Pattern[str], ...]


def _compile(items: list[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in items)


@functools.lru_cache(maxsize=4)
def log_lines(family: Family) -> LogLines:
    """The patterns of the pinned version of an engine family."""
    import yaml

    doc = yaml.safe_load(LOG_LINES_FILE.read_text(encoding="utf-8"))
    version = VERSIONS[family]
    data = doc[version]
    one = {k: re.compile(data[k], re.IGNORECASE) if data.get(k) else None for k in ("world", "experts", "rank_line")}
    return LogLines(version=version, moe=_compile(data["moe"]), attention=_compile(data["attention"]),
                    fallback=_compile(data["fallback"]), marlin_warning=_compile(data["marlin_warning"]),
                    rank_prefix=re.compile(data["rank_prefix"], re.IGNORECASE),
                    args=re.compile(data["args"]), world=one["world"], experts=one["experts"],
                    rank_line=one["rank_line"], prefix_cache_off=_compile(data.get("prefix_cache_off") or []),
                    moe_kinds={k: frozenset(n.lower() for n in v) for k, v in doc["moe_kinds"].items()})


@functools.lru_cache(maxsize=1)
def ascend_graph_lines() -> GraphLines:
    """vLLM-Ascend's graph-mode patterns (engines/data/log-lines.yaml)."""
    import yaml

    data = yaml.safe_load(LOG_LINES_FILE.read_text(encoding="utf-8"))[ASCEND_VERSION]
    return GraphLines(ASCEND_VERSION, re.compile(data["graph_captured"], re.IGNORECASE), _compile(data["graph_off"]))
