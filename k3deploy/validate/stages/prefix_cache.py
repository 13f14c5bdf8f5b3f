"""Stage `prefix-cache`: a two-turn conversation over a long shared prefix hits the cache where the planner
predicts, the hit turn still retrieves its facts, and a hit answers exactly as the same request sent cold
(cache-salted on vLLM, after a flush on SGLang): hybrid caches have restored the wrong linear-attention state
while "hitting". Facts lost on the hit and cold alike (the same tokens) are a state lost without the cache's
help, which `long` catches: this stage then passes and says so."""
from __future__ import annotations

import uuid
from typing import Any

from k3deploy.planning.prefix_hits import predicted_hit_tokens
from k3deploy.validate import haystack
from k3deploy.validate.chat import CACHE_REPORT_FLAG, PREFIX_CACHE_FLAG, Chat, effort_fields, effort_via
from k3deploy.validate.reach import rank0_http
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.stages.long import RETRIEVAL_EFFORT, retrieval_line, sized, sizing_failed
from k3deploy.validate.streamed import StreamRecord

SGLANG_CACHED_OVER_PROMPT = 2  # SGLang may report cached_tokens up to 2 above prompt_tokens (a think stub)


def first_difference(hit: list[str], cold: list[str]) -> str:
    """Where two token streams part, for the failure line."""
    for i, (a, b) in enumerate(zip(hit, cold)):
        if a != b:
            return f"token {i} is {a!r} on the hit, {b!r} cold"
    return f"the hit gave {len(hit)} tokens, the cold request {len(cold)}"


def cache_off_line(ctx: ValidateContext) -> str | None:
    """The engine's own line saying it runs without a prefix cache (vLLM on CPU for MLA models), from any node."""
    from k3deploy.engines.log_lines import log_lines
    from k3deploy.validate.logscan import last_match
    from k3deploy.validate.reach import node_logs
    from k3deploy.validate.stages.kernels import family_of

    patterns = log_lines(family_of(ctx)).prefix_cache_off
    for _, text in sorted(node_logs(ctx).items()):
        found = last_match(text.splitlines(), patterns)
        if found is not None:
            return found.evidence
    return None


class PrefixCacheStage:
    """Hit size, retrieval on the hit, and hit-versus-cold token equality."""

    name = "prefix-cache"
    needs_deployment = True

    def run(self, ctx: ValidateContext) -> StageResult:
        """Turn 1 cold, turn 2 on the hit, turn 2 again cold; every problem found is listed."""
        settings = ctx.topology.validate_
        facts = haystack.facts_at(settings.retrieval_depths)
        effort = effort_fields(RETRIEVAL_EFFORT, effort_via(ctx))
        limit = ctx.topology.serving.context_length - 2 * settings.answer_max_tokens
        with rank0_http(ctx, settings.request_timeout_s) as http:
            chat = Chat(http, ctx)
            sizing = sized(chat, facts)
            if isinstance(sizing, str):
                return sizing_failed(self.name, sizing)
            notes = haystack.haystack(sizing.sentences_for(min(settings.prefix_cache_tokens, limit)), facts,
                                      uuid.uuid4().hex[:12])
            turn1 = [{"role": "user", "content": notes + "\n\nSummarise the notes in one sentence."}]
            mark = ctx.routed.mark()
            first = chat.ask(turn1, settings.answer_max_tokens, **effort)
            who = [ctx.routed.since(mark)]
            if first.error is not None:
                return StageResult(name=self.name, status="fail",
                                   detail=f"turn 1 failed: {first.error[:200]}", evidence=first.error)
            turn2 = [*turn1, {"role": "assistant", "content": first.content},
                     {"role": "user", "content": haystack.questions(facts)}]
            mark = ctx.routed.mark()
            hit = chat.ask(turn2, settings.answer_max_tokens, **effort)
            who += [ctx.routed.since(mark)]
            cold, how = chat.cold(turn2, settings.answer_max_tokens, **effort)
        result = self._result(ctx, chat.dialect, facts, first, hit, cold, how)
        return ctx.routed.kept_together(result, who, first.error is None)

    def _result(self, ctx: ValidateContext, dialect: str, facts: list[haystack.Fact], first: StreamRecord,
                hit: StreamRecord, cold: StreamRecord | None, how: str) -> StageResult:
        settings = ctx.topology.validate_
        predicted = predicted_hit_tokens(first.prompt_tokens or 0, settings.cache_block_tokens)
        problems: list[str] = []
        if hit.error is not None:
            problems.append(f"turn 2 failed: {hit.error[:200]}")
        cached, prompt = hit.cached_tokens, hit.prompt_tokens or 0
        if hit.error is None and cached is None:
            problems.append(f"turn 2 cached_tokens not reported (unknown, not zero): start the engine with "
                            f"{CACHE_REPORT_FLAG[dialect]}")
        elif cached is not None and cached < predicted:
            off = cache_off_line(ctx)
            why = (f"the engine turned prefix caching off itself: {off}" if off
                   else f"prefix caching is off or not hitting ({PREFIX_CACHE_FLAG[dialect]})")
            problems.append(f"turn 2 cached_tokens {cached:,} < {predicted:,} predicted (of {prompt:,} prompt "
                            f"tokens): {why}")
        elif cached is not None and cached > prompt + SGLANG_CACHED_OVER_PROMPT:
            problems.append(f"turn 2 cached_tokens {cached:,} > prompt_tokens {prompt:,}")
        elif cached is not None and prompt and cached / prompt < settings.min_cache_hit_ratio:
            problems.append(f"turn 2 hit {cached / prompt:.0%} of the prompt < validate.min_cache_hit_ratio "
                            f"{settings.min_cache_hit_ratio:.0%}")
        found = haystack.retrieved(facts, hit.content)
        # Facts the hit loses and the same request sent cold loses token for token are not the cache's doing
        # (the state is wrong with or without a hit): `long` judges retrieval; this stage judges the cache.
        cold_alike = cold is not None and cold.error is None and not cold.cached_tokens and hit.deltas == cold.deltas
        if hit.error is None and not all(found.values()) and not cold_alike:
            problems.append(f"on the cache hit, {retrieval_line(found)}")
        if cold is None:
            problems.append(f"hit correctness not checked: no cold request could be made ({how})")
        elif cold.error is not None:
            problems.append(f"turn 2 sent cold ({how}) failed: {cold.error[:200]}")
        elif cold.cached_tokens:
            problems.append(f"turn 2 sent cold ({how}) still hit {cold.cached_tokens:,} cached tokens: the hit's "
                            f"correctness cannot be judged")
        elif hit.error is None and hit.deltas != cold.deltas:
            problems.append(f"a cache hit changed the answer: {first_difference(hit.deltas, cold.deltas)} ({how})")
        results: dict[str, Any] = {
            "turn1_prompt_tokens": first.prompt_tokens, "turn2_prompt_tokens": prompt, "cached_tokens": cached,
            "predicted_cached_tokens": predicted, "block_tokens": settings.cache_block_tokens,
            "retrieved_on_hit": {f"{d:.0%}": ok for d, ok in found.items()},
            "cold_cached_tokens": cold.cached_tokens if cold is not None else None,
            "hit_ttft_ms": round((hit.ttft_s or 0) * 1000, 1),
            "cold_ttft_ms": round((cold.ttft_s or 0) * 1000, 1) if cold is not None else None}
        if problems:
            return StageResult(name=self.name, status="fail", detail="; ".join(problems),
                               evidence=f"hit answer: {hit.content[:300]!r}" + (
                                   f"\ncold answer: {cold.content[:300]!r}" if cold is not None else ""),
                               results=results)
        lost = "" if all(found.values()) else " and cold alike (not the cache: `long` judges retrieval)"
        detail = (f"turn 2 cached {cached:,} of {prompt:,} tokens (predicted ≥ {predicted:,}); "
                  f"{retrieval_line(found)} on the hit{lost}; hit and cold ({how}) answers equal token for token")
        return StageResult(name=self.name, status="pass", detail=detail,
                           evidence=f"hit answer: {hit.content[:300]!r}", results=results)

