"""Stage `long`: one request near the configured context length succeeds with the prompt tokens expected, and
facts planted at several depths of it come back (a lost linear-attention state still answers fluently)."""
from __future__ import annotations

import uuid

from k3deploy.validate import haystack
from k3deploy.validate.chat import Chat, effort_fields, effort_via
from k3deploy.validate.reach import rank0_http
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.streamed import StreamRecord

RETRIEVAL_EFFORT = "low"  # the check is recall, not reasoning: the least thinking keeps the answer in budget


def prompt_tolerance(expected: int) -> int:
    """How far usage.prompt_tokens may be from the calibrated prediction (nonces tokenize unevenly)."""
    return max(32, expected // 100)


def sized(chat: Chat, facts: list[haystack.Fact], extra: str = "",
          role: str = "user") -> haystack.Sizing | str:
    """Calibrate filler sentences -> prompt tokens with the engine's tokenizer; else the engine's error."""
    def count(sentences: int) -> int | str:
        text = haystack.haystack(sentences, facts, uuid.uuid4().hex[:12]) + extra
        return chat.count([{"role": role, "content": text}])
    return haystack.calibrate(count)


def sizing_failed(name: str, why: str) -> StageResult:
    """The stage's result when its prompt could not be sized: the engine's own answer, not a missing field."""
    return StageResult(name=name, status="fail",
                       detail=f"sizing the prompt with the engine's tokenizer failed: {why[:300]}", evidence=why)


def retrieval_line(found: dict[float, bool]) -> str:
    """'facts retrieved at every depth (10%, 50%, 90%)' or what was lost."""
    if all(found.values()):
        return f"facts retrieved at every depth ({haystack.depth_list(found, True)})"
    return f"facts lost at {haystack.depth_list(found, False)} (retrieved at {haystack.depth_list(found, True)})"


def context_note(chat: Chat, configured: int) -> str:
    """What rank 0 says its context length is, when it says and it differs from the topology."""
    try:
        data = chat.http.get("/v1/models", 10.0).json().get("data") or [{}]
    except Exception:  # noqa: BLE001 - only a hint for the failure line
        return ""
    served = data[0].get("max_model_len")
    if isinstance(served, int) and served < configured:
        return f"; rank 0 serves max_model_len {served:,} < serving.context_length {configured:,}"
    return ""


class LongStage:
    """A near-context-length request and retrieval at depths."""

    name = "long"
    needs_deployment = True

    def run(self, ctx: ValidateContext) -> StageResult:
        """Size the prompt with the engine's tokenizer, send it, check tokens and facts."""
        settings, context = ctx.topology.validate_, ctx.topology.serving.context_length
        wanted = settings.long_request_tokens or int(context * settings.long_request_fraction)
        target = min(wanted, context - settings.answer_max_tokens)
        facts = haystack.facts_at(settings.retrieval_depths)
        closing = "\n\n" + haystack.questions(facts)
        with rank0_http(ctx, settings.request_timeout_s) as http:
            chat = Chat(http, ctx)
            sizing = sized(chat, facts, closing)
            if isinstance(sizing, str):
                return sizing_failed(self.name, sizing)
            sentences = sizing.sentences_for(target)
            expected = sizing.tokens_for(sentences)
            text = haystack.haystack(sentences, facts, uuid.uuid4().hex[:12]) + closing
            rec = chat.ask([{"role": "user", "content": text}], settings.answer_max_tokens,
                           **effort_fields(RETRIEVAL_EFFORT, effort_via(ctx)))
            note = context_note(chat, context) if rec.error else ""
        return self._result(rec, facts, expected, target, wanted, note)

    def _result(self, rec: StreamRecord, facts: list[haystack.Fact], expected: int, target: int, wanted: int,
                note: str) -> StageResult:
        clamp = f" (asked {wanted:,}, less answer room)" if target < wanted else ""
        if rec.error is not None:
            return StageResult(name=self.name, status="fail",
                               detail=f"a {expected:,}-token request{clamp} failed: {rec.error[:200]}{note}",
                               evidence=rec.error)
        got, tol = rec.prompt_tokens or 0, prompt_tolerance(expected)
        found = haystack.retrieved(facts, rec.content)
        ttft = f"TTFT {rec.ttft_s:.2f} s" if rec.ttft_s is not None else "no token"
        problems = []
        if abs(got - expected) > tol:
            problems.append(f"usage.prompt_tokens {got:,}, expected {expected:,} ± {tol}")
        if not all(found.values()):
            problems.append(retrieval_line(found))
        if rec.finish_reason not in ("stop", "length"):
            problems.append(f"finish_reason {rec.finish_reason!r}")
        detail = (f"{got:,} prompt tokens{clamp}, {ttft}, " if not problems else "; ".join(problems) + "; ")
        detail += retrieval_line(found) if not problems else f"{ttft}"
        evidence = f"answer: {rec.content[:400]!r}" + (f"; reasoning: {rec.reasoning[:120]!r}" if problems else "")
        return StageResult(name=self.name, status="fail" if problems else "pass", detail=detail,
                           evidence=evidence,
                           results={"prompt_tokens": got, "expected_prompt_tokens": expected,
                                    "ttft_ms": round((rec.ttft_s or 0) * 1000, 1),
                                    "retrieved": {f"{d:.0%}": ok for d, ok in found.items()}})
