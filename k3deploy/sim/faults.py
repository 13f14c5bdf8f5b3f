"""Fault injection for tests: K3SIM_FAULT=name[:value][,...], only on K3SIM_FAULT_RANK when set (values are
seconds, tokens or factors, as each fault says in the README)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

FAULT_ENV = "K3SIM_FAULT"
FAULT_RANK_ENV = "K3SIM_FAULT_RANK"
FAULTS = ("crash_after_load", "hang_at_rendezvous", "slow_load", "wrong_kernel", "oom",
          # The engine runs a different expert-parallel size than it was given (and says so).
          "wrong_topology",
          # The parser flag was passed, yet the engine answers as if it had no such parser.
          "no_reasoning_parser", "no_tool_parser",
          # what the validate stages long, prefix-cache and effort must catch
          "no_prefix_cache", "no_cache_report", "wrong_cache_state", "short_context", "slow_decode",
          "kda_state_zeroed", "kda_state_lost_beyond",
          # what the validate stages vision and short must catch: an image accepted and left out of the prompt, a
          # response_format JSON schema answered with free text
          "image_dropped", "schema_ignored",
          # prefill/decode disaggregation: the prefill sends the MLA KV but a zeroed KDA state, or none; the
          # prefill process dies while a decode is reading its KV
          "transfer_kda_zeroed", "transfer_kda_dropped", "prefill_dies_mid_transfer",
          # a worker node outlives its head silently, as vLLM 0.32.0's headless node does (peer_loss.py)
          "outlive_head",
          # SIGTERM is honoured after S seconds (a real engine drains and frees its GPUs before it exits)
          "slow_stop")
# Bounds on the sleeping faults, so a forgotten stand-in process never outlives its test by much.
HANG_DEFAULT_S = 3600.0
SLOW_LOAD_DEFAULT_S = 10.0
SLOW_STOP_DEFAULT_S = 5.0
MAX_SLEEP_S = 3600.0


class FaultError(ValueError):
    """K3SIM_FAULT or K3SIM_FAULT_RANK does not parse."""


@dataclass(frozen=True)
class Faults:
    """The faults this node applies, with their optional values (seconds)."""

    active: dict[str, float | None] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.active

    def seconds(self, name: str, default: float) -> float:
        """The fault's value in seconds, bounded by MAX_SLEEP_S."""
        value = self.active.get(name)
        return min(value if value is not None else default, MAX_SLEEP_S)

    def value(self, name: str, default: float) -> float:
        """The fault's value (tokens, a factor), or default when none was given."""
        value = self.active.get(name)
        return value if value is not None else default


def parse_faults(env: Mapping[str, str], node_rank: int) -> Faults:
    """The faults named in env that apply to this node rank."""
    spec = env.get(FAULT_ENV, "").strip()
    rank = env.get(FAULT_RANK_ENV, "").strip()
    if rank and not rank.isdigit():
        raise FaultError(f"{FAULT_RANK_ENV}={rank!r} is not a node rank")
    active: dict[str, float | None] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition(":")
        if name not in FAULTS:
            raise FaultError(f"{FAULT_ENV}: unknown fault {name!r} (known: {', '.join(FAULTS)})")
        try:
            active[name] = float(value) if value else None
        except ValueError as exc:
            raise FaultError(f"{FAULT_ENV}: {name} takes a number, not {value!r}") from exc
    if rank and int(rank) != node_rank:
        return Faults()
    return Faults(active)
