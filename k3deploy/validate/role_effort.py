"""The effort stage across prefill/decode roles: the same load through the router, its measured TTFT (prefill +
transfer) and TPOT (decode) held against the planner's prediction per role (planning/pd_prediction.py); a role
far slower than predicted fails, naming that role's figure."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from k3deploy.validate.predicted import JUDGED_TTFT_MS, band_note, judged_share, predicted
from k3deploy.validate.stage import ValidateContext
from k3deploy.validate.stages.effort import EffortStage

if TYPE_CHECKING:
    from k3deploy.topology.schema import Topology


class RoleEffortStage(EffortStage):
    """EffortStage judged per role: `service` is the topology with `roles` the router fronts."""

    def __init__(self, service: Topology) -> None:
        self.service = service

    def judge(self, ctx: ValidateContext, cold: dict[str, Any], prompts: int) -> tuple[list[str], dict[str, Any], str]:
        """(problems, results, evidence line) of the cold run's TTFT and TPOT against each role's prediction."""
        from k3deploy.catalog.loader import load_catalog
        from k3deploy.planning.pd_prediction import predict_roles, roles_json

        got = predicted(ctx, cold, prompts, lambda w: predict_roles(self.service, ctx.catalog or load_catalog(), w))
        if isinstance(got, dict):
            return [], got, ""
        w, p = got
        ttft_ms, tpot_ms = (p.ttft_s or 0.0) * 1000, p.tpot_s * 1000
        speed = {"prefill": ttft_ms / max(cold["mean_ttft_ms"], 1e-9) if p.ttft_s is not None else None,
                 "decode": tpot_ms / max(cold["mean_tpot_ms"], 1e-9)}
        results = {"predicted_per_role": roles_json(p), "share_of_predicted": speed}
        ttft = (f"prefill role TTFT {ttft_ms:,.1f} ms (prefill, queue and transfer)" if p.ttft_s is not None
                else f"prefill role TTFT not predicted ({p.ttft_unknown})")
        evidence = (f"predicted per role for cold ({w.input_tokens:,} in / {w.output_tokens:,} out, concurrency "
                    f"{w.concurrency}): {ttft}, decode role TPOT {tpot_ms:.2f} ms; measured TTFT "
                    f"{cold['mean_ttft_ms']:,.1f} ms, TPOT {cold['mean_tpot_ms']:.2f} ms")
        asked = ctx.topology.validate_.min_share_of_prediction
        share = judged_share(asked, p.band)
        why = f"validate.min_share_of_prediction {asked:g}{band_note(p.band)}: below {share:.0%} fails"
        problems = []
        if share and speed["decode"] < share:
            problems.append(f"cold: the decode role's TPOT is far above its prediction ({why}): mean TPOT {cold['mean_tpot_ms']:,.2f} ms against "
                            f"{tpot_ms:,.2f} ms predicted for the decode instance ({speed['decode']:.0%} of its "
                            f"predicted speed)")
        # A TTFT shorter than this is mostly HTTP and scheduling cost, not the prefill the model predicts.
        if share and speed["prefill"] is not None and speed["prefill"] < share and ttft_ms >= JUDGED_TTFT_MS:
            problems.append(f"cold: the prefill role's TTFT (prefill, queue and transfer) is far above its prediction "
                            f"({why}): mean TTFT {cold['mean_ttft_ms']:,.0f} "
                            f"ms against {ttft_ms:,.0f} ms predicted ({speed['prefill']:.0%} of its predicted speed)")
        return problems, results, evidence

