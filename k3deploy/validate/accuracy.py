"""An accuracy run on a maintained harness: lm-eval's `local-chat-completions` model against a deployment's chat
API, on a multiple-choice dataset file (JSON lines of {"question": ..., "answer": "A".."D"}), the sampling fixed
(temperature 0, the reasoning effort given), each sample counted as completed, missing (no answer text: the
reasoning used up max_tokens), or unparsed (no answer letter found), beside the exact-match score. lm-eval stops
at a request that keeps failing: the run then fails naming it (every sample not yet answered is counted failed)."""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, NamedTuple

# The small recall dataset k3deploy ships (the demo's; the stand-in's reference score in the catalog is for it).
BUILTIN_DATASET = Path(__file__).resolve().parent / "data" / "recall-mc.jsonl"

# The answer letter, as "Answer: C", "answer is C." or "... is C." ends it; the last one counts.
ANSWER_REGEX = r"(?:[Aa]nswer\s*(?:is)?\s*:?|\bis)\s*\(?([A-D])\)?(?:\.|\b)"
FILTER = "letter"
METRIC = "exact_match"
INVALID = "[invalid]"  # lm-eval's regex filter fallback: nothing matched


class AccuracyRun(NamedTuple):
    """One task's outcome: the score and how every sample ended."""

    task: str
    dataset_sha256: str
    samples: int
    completed: int
    failed: int
    missing: int
    unparsed: int
    score: float
    excerpts: tuple[str, ...]  # a few answers that were not completed, to show


def sha256_of(path: Path) -> str:
    """The dataset file's sha256: its pinned revision."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def task_config(task: str, dataset: Path, max_tokens: int, effort: str) -> dict[str, Any]:
    """The lm-eval task: the file's questions asked as chat, the letter read by regex, exact match scored."""
    return {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(dataset)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": [], "max_gen_toks": max_tokens, "temperature": 0.0, "do_sample": False,
                              "reasoning_effort": effort},
        "filter_list": [{"name": FILTER, "filter": [
            {"function": "regex", "regex_pattern": ANSWER_REGEX, "group_select": -1, "fallback": INVALID},
            {"function": "take_first"}]}],
        "metric_list": [{"metric": METRIC, "aggregation": "mean", "higher_is_better": True}],
    }


def run_accuracy(base_url: str, model: str, task: str, dataset: Path, *, max_tokens: int, effort: str,
                 timeout_s: float, limit: int | None = None) -> AccuracyRun:
    """Evaluate `model` at `base_url` (an OpenAI-compatible server reachable from here) on the dataset file."""
    import lm_eval
    import tenacity  # noqa: F401 - lm-eval's API models need it (lm-eval[api]); missing, name it before the run

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    digest = sha256_of(dataset)
    total = sum(1 for line in dataset.read_text(encoding="utf-8").splitlines() if line.strip())
    total = min(total, limit) if limit else total
    args = {"base_url": f"{base_url.rstrip('/')}/v1/chat/completions", "model": model, "num_concurrent": 1,
            "max_retries": 2, "tokenized_requests": False, "timeout": int(timeout_s)}
    try:
        out = lm_eval.simple_evaluate(model="local-chat-completions", model_args=args,
                                      tasks=[task_config(task, dataset, max_tokens, effort)],
                                      apply_chat_template=True, log_samples=True, limit=limit,
                                      random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                      fewshot_random_seed=0, verbosity="WARNING")
    except Exception as exc:
        raise HarnessStopped(f"lm-eval stopped: {type(exc).__name__}: {str(exc)[:300]}", digest, total) from exc
    if out is None:
        raise HarnessStopped("lm-eval returned no results", digest, total)
    rows: list[dict[str, Any]] = out.get("samples", {}).get(task, [])
    missing = unparsed = 0
    excerpts: list[str] = []
    for row in rows:
        raw = str((row.get("resps") or [[""]])[0][0] or "")
        got = str((row.get("filtered_resps") or [INVALID])[0])
        if not raw.strip():
            missing += 1
        elif got == INVALID:
            unparsed += 1
            if len(excerpts) < 3:
                excerpts.append(raw[-160:])
    score = float(out["results"][task][f"{METRIC},{FILTER}"])
    failed = total - len(rows)
    return AccuracyRun(task, digest, total, len(rows) - missing - unparsed, failed, missing, unparsed, score,
                       tuple(excerpts))


class HarnessStopped(RuntimeError):
    """lm-eval did not finish: every sample counts as failed."""

    def __init__(self, message: str, dataset_sha256: str, samples: int) -> None:
        super().__init__(message)
        self.dataset_sha256 = dataset_sha256
        self.samples = samples
