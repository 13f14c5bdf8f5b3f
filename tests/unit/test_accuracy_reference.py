"""Kimi K3's published GPQA Diamond score in the catalog, and the accuracy stage's verdict against it: the
comparison the stage makes once lm-eval has scored a dataset file (tests/unit/test_validate_accuracy.py runs the
harness for real on the stand-in, whose tiny model has no GPQA reference)."""
from __future__ import annotations

import math

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.topology.settings import ValidateSettings
from k3deploy.validate.accuracy import AccuracyRun
from k3deploy.validate.stages.accuracy import compared

pytestmark = pytest.mark.timeout(30)
QUESTIONS = 198  # GPQA Diamond


def _run(completed: int, failed: int = 0, unparsed: int = 0) -> AccuracyRun:
    return AccuracyRun("gpqa-diamond", "0" * 64, QUESTIONS, completed, failed, 0, unparsed,
                       completed / QUESTIONS, ())


def test_kimi_k3_carries_the_model_cards_gpqa_diamond_score() -> None:
    """93.5 on Moonshot's Kimi-K3 card, for lm-eval's generative zero-shot chain-of-thought GPQA Diamond task; the
    tolerance covers two binomial standard errors at 198 questions."""
    ref = load_catalog().models["kimi-k3"].accuracy_references["gpqa-diamond"]
    assert (ref.score, ref.lm_eval_task, ref.dataset_sha256) == (0.935, "gpqa_diamond_cot_zeroshot", None)
    assert "huggingface.co/moonshotai/Kimi-K3" in ref.sources["score"]
    assert ref.tolerance >= 2 * math.sqrt(ref.score * (1 - ref.score) / QUESTIONS)
    assert ValidateSettings(accuracy_task="gpqa-diamond").accuracy_task == "gpqa-diamond"


@pytest.mark.parametrize("completed, failed, status, said", [
    (185, 0, "pass", ("gpqa-diamond: score 0.934 (198 samples: 185 completed, 0 failed, 0 missing, 13 unparsed), "
                      "at least the reference 0.935 - 0.040 (lm-eval gpqa_diamond_cot_zeroshot's questions)")),
    (178, 0, "pass", "at least the reference 0.935 - 0.040"),  # 178 / 198 = 0.899, above the floor 0.895
    (177, 0, "fail", "below the reference 0.935 - 0.040"),  # 177 / 198 = 0.894, just below it
    (170, 0, "fail", ("gpqa-diamond: score 0.859 (198 samples: 170 completed, 0 failed, 0 missing, 28 unparsed) "
                      "below the reference 0.935 - 0.040 (lm-eval gpqa_diamond_cot_zeroshot's questions) for "
                      "kimi-k3: the deployment answers worse than the model should")),
    (190, 2, "fail", "below the reference 0.935 - 0.040"),  # a failed request fails the stage whatever the score
])
def test_the_stage_compares_a_score_with_the_reference(completed: int, failed: int, status: str, said: str) -> None:
    ref = load_catalog().models["kimi-k3"].accuracy_references["gpqa-diamond"]
    got = _run(completed, failed, QUESTIONS - completed - failed)
    verdict = compared("kimi-k3", ref, got, {"task": got.task})
    assert verdict.status == status and said in verdict.detail, verdict.detail
