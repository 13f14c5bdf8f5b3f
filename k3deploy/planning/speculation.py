"""Speculative decoding as a topology configures it through engine.args: draft tokens proposed per step
(SGLang `--speculative-algorithm DSPARK --speculative-dspark-block-size N`, vLLM `--speculative-config
'{"num_speculative_tokens": N, ...}'`), and the tokens a verify step keeps (the model's catalog figure)."""
from __future__ import annotations

import json
from typing import Any

from k3deploy.catalog.specs import ModelSpec, ReplayRing
from k3deploy.planning.perf_model import PerfUnknown


def draft_tokens(args: dict[str, Any]) -> int:
    """Draft tokens per step the engine flags ask for (0: no speculative decoding)."""
    algorithm = args.get("--speculative-algorithm")
    if algorithm not in (None, False):
        if str(algorithm).upper() != "DSPARK":
            raise PerfUnknown(f"engine.args --speculative-algorithm {algorithm}: only DSPARK (K3's draft) is "
                              "modelled")
        block = args.get("--speculative-dspark-block-size")
        if block in (None, False, True):
            raise PerfUnknown("engine.args: DSPARK without --speculative-dspark-block-size: set it (e.g. 7) to "
                              "predict")
        return _count(block, "--speculative-dspark-block-size")
    raw = args.get("--speculative-config")
    if raw in (None, False):
        return 0
    try:
        config = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise PerfUnknown(f"engine.args --speculative-config {raw!r}: not JSON") from None
    if not isinstance(config, dict) or "num_speculative_tokens" not in config:
        raise PerfUnknown("engine.args --speculative-config: no num_speculative_tokens to predict with")
    method = str(config.get("method") or "dspark").lower()
    if method != "dspark":
        raise PerfUnknown(f"engine.args --speculative-config method {method}: only DSpark (K3's draft) is timed "
                          "(its memory is budgeted)")
    return _count(config["num_speculative_tokens"], "num_speculative_tokens")


def pinned_acceptance(env_name: str | None, env: dict[str, str], drafts: int) -> float | None:
    """Tokens a verify step keeps as engine.env pins them (SGLang SGLANG_SIMULATE_ACC_LEN), None when unpinned."""
    if not drafts or env_name is None or env_name not in env:
        return None
    try:
        value = float(env[env_name])
    except ValueError:
        value = 0.0
    if not 1 <= value <= drafts + 1:
        raise PerfUnknown(f"engine.env {env_name}={env[env_name]!r}: expected a number from 1 to {drafts + 1} "
                          f"(tokens a verify step of {drafts} drafts keeps)")
    return value


def replay_ring_len(args: dict[str, Any], ring: ReplayRing | None) -> int:
    """Ring records per KDA state slot the engine flags ask for (SGLang `--enable-linear-replayssm-spec`,
    `--linear-replayssm-cache-len`); 0 when ReplaySSM verify is off or the engine has none."""
    if ring is None or args.get(ring.flag) is not True:
        return 0
    n = args.get(ring.len_flag)
    return ring.ring_len if n in (None, False) else _count(n, ring.len_flag)


def acceptance(model: ModelSpec, drafts: int) -> float:
    """Mean tokens one verify step keeps (1 without speculation); PerfUnknown when the catalog has no figure."""
    if drafts == 0:
        return 1.0
    value = model.draft_acceptance_length.get(drafts)
    if value is None:
        known = ", ".join(str(k) for k in sorted(model.draft_acceptance_length)) or "none"
        raise PerfUnknown(f"model {model.id} has no draft_acceptance_length for {drafts} draft tokens in the "
                          f"catalog (known: {known}); add one with --catalog DIR, with its source")
    return value


def _count(value: Any, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise PerfUnknown(f"engine.args {what} {value!r}: expected a whole number >= 1")
    return n
