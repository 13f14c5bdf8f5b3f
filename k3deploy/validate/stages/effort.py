"""Stage `effort`: a bounded load run at serving.reasoning_effort and validate.concurrency, a cold workload
(every prompt unique) and a prefix-hit workload (one shared system prompt) reported apart; the topology's
thresholds decide."""
from __future__ import annotations

import uuid
from typing import Any

from k3deploy.validate import haystack
from k3deploy.validate.chat import Chat, effort_fields, effort_via
from k3deploy.validate.loadgen import CHAT_PATH, LoadRun, run_load, run_load_on_node, summarize
from k3deploy.validate.predicted import compare
from k3deploy.validate.reach import rank0_http
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.stages.long import sized, sizing_failed

WHERE = {"here": "from here", "forwarded": "from here through rank 0's tunnel",
         "on-node": "on the node (rank 0), by one python3 process there"}


def _bodies(chat: Chat, ctx: ValidateContext, shared: bool, sentences: int) -> list[dict[str, Any]]:
    settings = ctx.topology.validate_
    count = settings.effort_requests or 2 * settings.concurrency
    run = uuid.uuid4().hex[:12]
    effort = effort_fields(ctx.topology.serving.reasoning_effort, effort_via(ctx))
    bodies = []
    for i in range(count):
        notes = haystack.haystack(sentences, [], f"{run}-shared" if shared else f"{run}-{i}")
        messages = [{"role": "system", "content": notes},
                    {"role": "user", "content": f"Question {i}: which of the notes concern water?"}]
        bodies.append(chat.body(messages, settings.effort_max_tokens, **effort))
    return bodies


def _problems(name: str, summary: dict[str, Any], ctx: ValidateContext) -> list[str]:
    settings = ctx.topology.validate_
    out = []
    if summary["failed"]:
        out.append(f"{name}: {summary['failed']} of {summary['failed'] + summary['completed']} requests failed "
                   f"({summary['errors'][0] if summary['errors'] else ''})")
    if summary["output_throughput"] < settings.min_throughput_tok_s:
        out.append(f"{name}: {summary['output_throughput']:,.0f} output tokens/s < validate.min_throughput_tok_s "
                   f"{settings.min_throughput_tok_s:,.0f}")
    if settings.max_p99_ttft_s is not None and summary["p99_ttft_ms"] > settings.max_p99_ttft_s * 1000:
        out.append(f"{name}: p99 TTFT {summary['p99_ttft_ms']:,.0f} ms > validate.max_p99_ttft_s "
                   f"{settings.max_p99_ttft_s:g} s")
    if settings.max_mean_tpot_ms is not None and summary["mean_tpot_ms"] > settings.max_mean_tpot_ms:
        out.append(f"{name}: mean TPOT {summary['mean_tpot_ms']:.1f} ms > validate.max_mean_tpot_ms "
                   f"{settings.max_mean_tpot_ms:g}")
    return out


def _first_answer(s: dict[str, Any]) -> str:
    """The first-answer-token figure, only over requests that had one (never '0 ms' for none)."""
    answered, done = s.get("answered", s["completed"]), s["completed"]
    if not answered:
        return "no answer token arrived (reasoning only, or empty)"
    part = f" ({answered} of {done} answered)" if answered < done else ""
    return f"first answer p50 {s['median_ttfa_ms']:,.0f} ms{part}"


def _line(name: str, s: dict[str, Any]) -> str:
    return (f"{name} {s['output_throughput']:,.0f} tok/s out ({s['output_throughput_per_gpu']:,.0f}/GPU), "
            f"TTFT p50 {s['median_ttft_ms']:,.0f} ms, {_first_answer(s)}, "
            f"TPOT {s['mean_tpot_ms']:.1f} ms, ITL p99 {s['p99_itl_ms']:.1f} ms, "
            f"reasoning {s['reasoning_token_share']:.0%}")


class EffortStage:
    """Load at the configured reasoning effort, cold and prefix-hit."""

    name = "effort"
    needs_deployment = True

    def judge(self, ctx: ValidateContext, cold: dict[str, Any], prompts: int) -> tuple[list[str], dict[str, Any], str]:
        """(problems, results, evidence line) of the cold run against the planner's prediction."""
        return compare(ctx, cold, prompts)

    def run(self, ctx: ValidateContext) -> StageResult:
        """Run both workloads one after the other and judge each against the thresholds."""
        settings = ctx.topology.validate_
        gpus = len(ctx.nodes) * ctx.topology.hardware.gpus_per_node
        summaries: dict[str, dict[str, Any]] = {}
        with rank0_http(ctx, settings.request_timeout_s) as http:
            chat = Chat(http, ctx)
            url = http.url_here(CHAT_PATH)
            sizing = sized(chat, [], role="system")
            if isinstance(sizing, str):
                return sizing_failed(self.name, sizing)
            # At least two hash blocks: a shorter shared prefix could never hit on a hybrid model.
            sentences = sizing.sentences_for(max(settings.effort_prompt_tokens, 2 * settings.cache_block_tokens))
            for name, shared in (("cold", False), ("prefix_hit", True)):
                bodies = _bodies(chat, ctx, shared, sentences)
                if shared:  # the first request caches the shared prefix for the rest
                    chat.send(bodies[0])
                run: LoadRun = (run_load(url, bodies, settings.concurrency, settings.request_timeout_s,
                                         ctx.routed.on_reply)
                                if url is not None else
                                run_load_on_node(http, bodies, settings.concurrency, settings.request_timeout_s))
                summaries[name] = summarize(run, gpus)
            route = http.route
        via = effort_via(ctx)
        results: dict[str, Any] = {"reasoning_effort": ctx.topology.serving.reasoning_effort, "effort_via": via,
                                   "max_concurrency": settings.concurrency, "num_prompts": len(bodies),
                                   "route": route, "load_ran": WHERE[route], "gpus": gpus, **summaries}
        problems = [p for name, s in summaries.items() for p in _problems(name, s, ctx)]
        off, vs_prediction, predicted = self.judge(ctx, summaries["cold"], len(bodies))
        problems += off
        results.update(vs_prediction)
        head = (f"effort {ctx.topology.serving.reasoning_effort} (as {via}), concurrency {settings.concurrency}, "
                f"{len(bodies)} requests per workload, load ran {WHERE[route]}")
        evidence = "\n".join([*(_line(n, s) for n, s in summaries.items()), *([predicted] if predicted else [])])
        if problems:
            return StageResult(name=self.name, status="fail", detail="; ".join(problems) + f" ({head})",
                               evidence=evidence, results=results)
        return StageResult(name=self.name, status="pass", detail=f"{head}: {evidence.replace(chr(10), '; ')}",
                           evidence=evidence, results=results)
