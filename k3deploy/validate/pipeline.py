"""Select stages (--only / --from / --skip) over the fixed order and run them into one report."""
from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.errors import ExecError, InputError
from k3deploy.validate import reach
from k3deploy.validate.stage import STAGE_NAMES, Stage, StageResult, ValidateContext
from k3deploy.verdicts.model import exit_code
from k3deploy.verdicts.timing import timed

NOT_IMPLEMENTED = "not implemented in this version of k3deploy"


class Report(BaseModel):
    """What `validate --json` prints (the contract is in the README)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment: str = Field(description="topology name")
    passed: bool = Field(description="every stage that ran passed (skipped stages do not fail a run)")
    exit_code: int = Field(description="0 passed, 1 a stage failed, 3 a stage could not reach its nodes")
    stages: list[StageResult] = Field(description="stages in order, as run (or skipped)")
    not_implemented: list[str] = Field(default_factory=list,
                                       description="selected stages this version does not have yet (not run)")


def _check_names(names: Sequence[str], option: str) -> None:
    for name in names:
        if name not in STAGE_NAMES:
            close = difflib.get_close_matches(name, STAGE_NAMES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise InputError(f"{option}: no stage named {name!r}{hint}; stages in order: {', '.join(STAGE_NAMES)}")


def select(implemented: Mapping[str, Stage], only: Sequence[str] = (), start: str | None = None,
           skip: Sequence[str] = ()) -> tuple[list[Stage], list[str]]:
    """(stages to run in order, selected names this version lacks); InputError for bad or unrunnable selections."""
    only = [n.strip() for item in only for n in item.split(",") if n.strip()]
    skip = [n.strip() for item in skip for n in item.split(",") if n.strip()]
    _check_names(only, "--only")
    _check_names(skip, "--skip")
    _check_names([start] if start else [], "--from")
    if only and start:
        raise InputError("--only and --from do not combine: pick one")
    names = [n for n in STAGE_NAMES if (not only or n in only) and (not start or
                                                                       STAGE_NAMES.index(n) >= STAGE_NAMES.index(start))]
    names = [n for n in names if n not in skip]
    missing = [n for n in names if n not in implemented]
    if only and missing:
        raise InputError(f"stage {', '.join(missing)}: {NOT_IMPLEMENTED} (implemented: {', '.join(implemented)})",
                         hint="run the implemented stages, e.g. --only shards")
    stages = [implemented[n] for n in names if n in implemented]
    if not stages:
        raise InputError(f"nothing to run: the selected stages are {NOT_IMPLEMENTED} "
                         f"(implemented: {', '.join(implemented)})")
    return stages, missing


def run_pipeline(ctx: ValidateContext, stages: Sequence[Stage], *, fail_fast: bool = False,
                 not_implemented: Sequence[str] = (),
                 on_stage: Callable[[str, StageResult | None], None] = lambda name, result: None) -> Report:
    """Run stages in order; `on_stage(name, None)` as one starts and `(name, result)` when it ends."""
    results: list[StageResult] = []
    stopped: str | None = None
    died: str | None = None  # the stage whose run (or whose start) found the deployment dead
    for stage in stages:
        on_stage(stage.name, None)
        live = stage.needs_deployment and ctx.deployment is not None
        if stopped is not None:
            result = StageResult(name=stage.name, status="skip", detail=f"not run: --fail-fast after {stopped}")
        elif stage.needs_deployment and ctx.deployment is None:
            result = StageResult(name=stage.name, status="skip",
                                 detail="needs a running deployment: none is recorded for "
                                        f"{ctx.name} (start one with `k3deploy launch`)")
        elif live and died is not None:
            result = StageResult(name=stage.name, status="skip",
                                 detail=f"not run: the deployment failed (found by {died})")
        elif live and (gone := reach.deployment_failure(ctx)) is not None:
            died = f"the check before {stage.name}"
            result = StageResult(name=stage.name, status="fail", evidence=gone,
                                 detail=f"the deployment failed before this stage: {gone}")
        else:
            found, seconds = timed(_run, stage, ctx)
            result = found.model_copy(update={"seconds": seconds})
            if live and result.status in ("fail", "error") and (gone := reach.deployment_failure(ctx)) is not None:
                # What the stage saw (a 500, a refused connection) is a symptom: say what happened first.
                died = stage.name
                result = result.model_copy(update={
                    "status": "fail", "detail": f"the deployment failed during this stage: {gone} "
                                                f"(the stage saw: {result.detail})",
                    "evidence": f"{gone}\n{result.evidence}".rstrip()})
        results.append(result)
        on_stage(stage.name, result)
        if fail_fast and stopped is None and result.status in ("fail", "error"):
            stopped = f"{stage.name} {'failed' if result.status == 'fail' else 'errored'}"
    code = exit_code((r.status for r in results), unreachable_first=False)
    return Report(deployment=ctx.name, passed=code == 0, exit_code=code, stages=results,
                  not_implemented=list(not_implemented))


def _run(stage: Stage, ctx: ValidateContext) -> StageResult:
    """The stage's result; a host error ends this stage, not the run."""
    try:
        return stage.run(ctx)
    except ExecError as exc:
        return StageResult(name=stage.name, status="error", detail=str(exc), evidence=exc.hint or "")
