"""Stage `accuracy`: does the deployment answer as well as the model should? lm-eval (`local-chat-completions`,
the `accuracy` extra) runs a multiple-choice dataset file against rank 0's chat API at temperature 0 and the
topology's reasoning effort (k3deploy.validate.accuracy); the exact-match score, with the completed, failed,
missing and unparsed samples counted beside it, is compared with the catalog's reference score for the model and
task (within its tolerance, for the dataset revision it pins). What FP8 KV, a new kernel or a lost recurrent state
breaks silently shows here as a lower score."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from k3deploy.catalog.specs import AccuracyReference
from k3deploy.validate import reach
from k3deploy.validate.accuracy import AccuracyRun, HarnessStopped, run_accuracy
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.stages.short import served_model


def _counts(run: AccuracyRun) -> str:
    return (f"{run.samples} samples: {run.completed} completed, {run.failed} failed, {run.missing} missing, "
            f"{run.unparsed} unparsed")


class AccuracyStage:
    """The harness over the dataset; the score against the catalog's reference."""

    name = "accuracy"
    needs_deployment = True

    def run(self, ctx: ValidateContext) -> StageResult:
        """One lm-eval run through rank 0's API (from this machine)."""
        v = ctx.topology.validate_
        if not v.accuracy_dataset:
            return StageResult(name=self.name, status="skip", detail="no dataset: pass --accuracy-dataset FILE or set "
                               "validate.accuracy_dataset (JSON lines of {question, answer: A..D})")
        dataset = Path(v.accuracy_dataset)
        ref = ctx.model.accuracy_references.get(v.accuracy_task)
        timeout_s = ctx.topology.validate_.request_timeout_s
        with reach.rank0_http(ctx, timeout_s) as http:
            if http.route != "here":
                return StageResult(name=self.name, status="skip", detail=f"rank 0's API ({http.base_url}) is not "
                                   "reachable from this machine, where the harness runs")
            model = served_model(http, ctx.topology.model.id)
            base_url = http.base_url
        try:
            # An engine refuses max_tokens past its context; the questions themselves are short.
            max_tokens = min(v.accuracy_max_tokens, ctx.topology.serving.context_length // 2)
            got = run_accuracy(base_url, model, v.accuracy_task, dataset, max_tokens=max_tokens,
                               effort=ctx.topology.serving.reasoning_effort, timeout_s=timeout_s,
                               limit=v.accuracy_limit)
        except HarnessStopped as exc:
            return StageResult(name=self.name, status="fail", detail=f"{v.accuracy_task}: {exc}: {exc.samples} "
                               f"samples failed", results={"task": v.accuracy_task, "samples": exc.samples,
                                                           "failed": exc.samples, "dataset_sha256": exc.dataset_sha256})
        results = {**got._asdict(), "excerpts": list(got.excerpts), "effort": ctx.topology.serving.reasoning_effort,
                   "reference": ref.score if ref else None, "tolerance": ref.tolerance if ref else None,
                   "reference_lm_eval_task": ref.lm_eval_task if ref else None}
        return compared(ctx.model.id, ref, got, results)


def compared(model_id: str, ref: AccuracyReference | None, got: AccuracyRun, results: dict[str, Any]) -> StageResult:
    """The stage's verdict on one harness run against the catalog's reference for the model and task."""
    name = AccuracyStage.name
    evidence = "\n".join(f"not completed: {e!r}" for e in got.excerpts)
    head = f"{got.task}: score {got.score:.3f} ({_counts(got)})"
    if ref is None:
        return StageResult(name=name, status="pass", results=results, evidence=evidence,
                           detail=f"{head}; the catalog has no reference score for {model_id} on {got.task}: not "
                           "compared")
    if ref.dataset_sha256 and ref.dataset_sha256 != got.dataset_sha256:
        return StageResult(name=name, status="fail", results=results, evidence=evidence,
                           detail=f"{head}; the dataset file (sha256 {got.dataset_sha256[:12]}) is not the revision "
                           f"the reference score is for ({ref.dataset_sha256[:12]}): not comparable")
    floor = ref.score - ref.tolerance
    # A published score is for a public task's questions: the file must hold them (it cannot be pinned by hash).
    of = f" (lm-eval {ref.lm_eval_task}'s questions)" if ref.lm_eval_task else ""
    if got.score + 1e-9 < floor or got.failed:
        return StageResult(name=name, status="fail", results=results, evidence=evidence,
                           detail=f"{head} below the reference {ref.score:.3f} - {ref.tolerance:.3f}{of} for "
                           f"{model_id}: the deployment answers worse than the model should")
    return StageResult(name=name, status="pass", results=results, evidence=evidence,
                       detail=f"{head}, at least the reference {ref.score:.3f} - {ref.tolerance:.3f}{of}")
