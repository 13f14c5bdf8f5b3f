"""The speculative draft a topology's engine flags name (SGLang `--speculative-algorithm`, vLLM
`--speculative-config`), the catalog draft whose memory it adds, and the draft checked against the target: the
method the catalog can size, the token count the named checkpoint expects, whose checkpoint it is, and a draft
quantization the engine would ignore. Pure."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from k3deploy.catalog.specs import Catalog, DraftCheckpoint, DraftSpec, ModelSpec
from k3deploy.diagnostics import Issue

SIZED = ("dspark", "eagle3")  # the methods the catalog has a draft for (ModelSpec.draft, .eagle3_draft)


@dataclass(frozen=True)
class DraftAsk:
    """What the speculative flags ask for."""

    flag: str  # the engine.args flag that carries it
    method: str  # lower case: dspark, eagle3, ...
    tokens: int | None  # draft tokens per step (None: the flags do not say, or not a whole number >= 1)
    tokens_flag: str  # where the count goes, as the user writes it
    path: str | None  # the draft checkpoint's path or hub name
    quantization: str | None


def _count(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 1 and not isinstance(value, bool) else None


def draft_ask(args: dict[str, Any]) -> DraftAsk | None:
    """The draft the engine flags ask for; None without speculative decoding (or a config that is not JSON: the
    engine flag checks report that)."""
    algorithm = args.get("--speculative-algorithm")
    if algorithm not in (None, False):
        method = str(algorithm).lower()
        tokens_flag = "--speculative-dspark-block-size" if method == "dspark" else "--speculative-num-steps"
        path = args.get("--speculative-draft-model-path")
        quant = args.get("--speculative-draft-model-quantization")
        return DraftAsk("--speculative-algorithm", method, _count(args.get(tokens_flag)), tokens_flag,
                        str(path) if path not in (None, False) else None,
                        str(quant) if quant not in (None, False) else None)
    raw = args.get("--speculative-config")
    if raw in (None, False):
        return None
    try:
        config = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    model, quant = config.get("model"), config.get("quantization")
    # vLLM without a method: a draft model's own config decides; K3's drafts are DSpark (seed 004 section 5.2).
    return DraftAsk("--speculative-config", str(config.get("method") or "dspark").lower(),
                    _count(config.get("num_speculative_tokens")), "num_speculative_tokens",
                    str(model) if model else None, str(quant) if quant else None)


def draft_spec(model: ModelSpec, ask: DraftAsk | None) -> DraftSpec | None:
    """The catalog draft whose weights, KV and state slots the budget holds (None: none it can size)."""
    if ask is None or ask.tokens is None:
        return None
    return {"dspark": model.draft, "eagle3": model.eagle3_draft}.get(ask.method)


def draft_tokens_budgeted(model: ModelSpec, args: dict[str, Any]) -> tuple[int, DraftSpec | None]:
    """(draft tokens per step, the draft) the memory budget counts; (0, None) when it counts none."""
    ask = draft_ask(args)
    spec = draft_spec(model, ask)
    return (ask.tokens or 0, spec) if ask is not None and spec is not None else (0, None)


def _named(path: str, checkpoint: DraftCheckpoint) -> bool:
    """A draft path names a checkpoint when it ends in the checkpoint's name (`/models/Kimi-K3-DSpark-Block5`)."""
    return path.rstrip("/").rsplit("/", 1)[-1].lower() == checkpoint.hub_repo.rsplit("/", 1)[-1].lower()


def draft_issues(args: dict[str, Any], catalog: Catalog, model: ModelSpec, engine_flavour: str) -> list[Issue]:
    """The speculative flags against the catalog: a draft it cannot size (warned), a known checkpoint run with
    another token count or a method it is not trained for, another model's draft (refused), and a draft
    quantization the engine ignores (warned)."""
    ask = draft_ask(args)
    if ask is None:
        return []
    path = f"engine.args.{ask.flag}"
    issues: list[Issue] = []
    if draft_spec(model, ask) is None:
        why = (f"no {ask.tokens_flag} (draft tokens per step) to size it with" if ask.tokens is None and
               ask.method in SIZED else f"the catalog has no {ask.method} draft for {model.id}")
        issues.append(Issue(code="SPEC_DRAFT_UNBUDGETED", severity="warning", path=path,
                            message=f"the memory budget counts no draft: {why}; the draft's weights, KV and state "
                            "slots come out of the pools this plan sized",
                            hint=f"set {ask.tokens_flag} (DSPARK or EAGLE3, each budgeted), or lower "
                            "serving.mem_fraction by the draft's weights per GPU"))
    if ask.path is not None:
        issues += _checkpoint_issues(ask, catalog, model, path)
    if ask.quantization is not None and engine_flavour == "vllm-ascend":
        # vllm_ascend/platform.py: "Speculative quantization is set but Ascend automatically uses the main
        # model's quantization method. parameter=quantization, action: resetting to None."
        issues.append(Issue(code="SPEC_DRAFT_QUANT", severity="warning", path=path,
                            message=f"draft quantization {ask.quantization}: vLLM-Ascend ignores it and runs the "
                            f"draft with the target's ({model.quantization or 'none'})",
                            hint="drop quantization from --speculative-config; use a draft of the target's "
                            "quantization variant (seed 004, FAQ)"))
    return issues


def _checkpoint_issues(ask: DraftAsk, catalog: Catalog, model: ModelSpec, path: str) -> list[Issue]:
    assert ask.path is not None
    own = next((c for c in model.draft_checkpoints if _named(ask.path, c)), None)
    if own is None:
        other = next(((m, c) for m in catalog.models.values() if m.hub_repo != model.hub_repo
                      for c in m.draft_checkpoints if _named(ask.path, c)), None)
        if other is not None:
            m, c = other
            known = ", ".join(x.hub_repo for x in model.draft_checkpoints) or "none in the catalog"
            return [Issue(code="SPEC_DRAFT_TARGET", severity="error", path=path,
                          message=f"draft {ask.path} is {c.hub_repo}, {m.id}'s draft: its tokenizer and hidden "
                          f"states are that model's, not {model.id}'s",
                          hint=f"use a draft of {model.id} ({known})")]
        return []
    out = []
    if ask.method != own.method:
        out.append(Issue(code="SPEC_DRAFT_METHOD", severity="error", path=path,
                         message=f"draft {own.hub_repo} is a {own.method} draft, the flags run it as {ask.method}",
                         hint=f"set the method to {own.method} ({own.source})"))
    if ask.tokens is not None and ask.tokens != own.num_speculative_tokens:
        out.append(Issue(code="SPEC_DRAFT_TOKENS", severity="error", path=path,
                         message=f"{ask.tokens_flag} {ask.tokens}, but {own.hub_repo} is trained for "
                         f"{own.num_speculative_tokens} draft tokens per step",
                         hint=f"set {ask.tokens_flag} to {own.num_speculative_tokens} ({own.source})"))
    return out
