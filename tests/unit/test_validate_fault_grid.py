"""The request stages' faults on both engine dialects, on this machine (local executor, one loopback node): each
stand-in fault fails exactly the stage that must catch it, with its evidence. Faults that touch different
stages share one launch, so the grid costs three launches a dialect. The multi-host rig keeps only what takes
an executor's own path (tests/integration/test_validate_all_ssh.py: logs through a jump host, requests through
rank 0's tunnel, the load forwarded); kernels and topology faults on both dialects: test_validate_live_stages."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests import figures
from tests.validate_serving import launched, sim_topology, statuses, validate_json

# The stand-in nodes rendezvous over Gloo: torch (skipped in the 3.10 run).
pytestmark = [pytest.mark.timeout(240), pytest.mark.torch]
STAGES = ("short", "vision", "long", "prefix-cache", "effort")
Expect = dict[str, dict[str, str]]  # stage -> {dialect or "*": pattern searched in its detail and evidence}

# fault -> the stage it must fail and what that stage must show (the rig's grid used the same patterns)
FAULTS: dict[str, Expect] = {
    "no_reasoning_parser": {"short": {
        "sglang": r"no reasoning in `reasoning_content`: the reasoning parser did not split it",
        "vllm": r"no reasoning in `reasoning`: the reasoning parser did not split it off"}},
    "no_tool_parser": {"short": {"*": r"no structured tool_calls: the tool-call parser did not run(.|\n)*"
                                      r"<\|tool_calls_section_begin\|>"}},
    "no_prefix_cache": {"prefix-cache": {"*": r"turn 2 cached_tokens 0 < [\d,]+ predicted .*prefix caching is off"}},
    "no_cache_report": {"prefix-cache": {
        "sglang": r"cached_tokens not reported \(unknown, not zero\): start the engine with --enable-cache-report",
        "vllm": r"cached_tokens not reported \(unknown, not zero\): start the engine with "
                r"--enable-prompt-tokens-details"}},
    "wrong_cache_state": {"prefix-cache": {"*": r"a cache hit changed the answer: token \d+ is .* on the hit"}},
    "short_context:2600": {"long": {"*": r"rank 0 serves max_model_len 2,600 < serving.context_length"}},
    "slow_decode": {"effort": {"*": r"cold: far below the prediction for this shape \(validate.min_share_of_prediction "
                                    r"0.2, band derived ±10%: below 20% fails\): the decode step runs at \d+% of its "
                                    r"predicted speed: mean TPOT [\d.]+ ms against [\d.]+ ms predicted \(the decode "
                                    r"step, bound by HBM reads\); output [\d,]+ tok/s against [\d,]+ predicted"}},
    # the linear-attention state lost: fluent answers, facts gone (prefix-cache passes: the hit loses what its
    # cold resend loses, token for token: not the cache's doing)
    "kda_state_zeroed": {"long": {"*": r"^facts lost at 10%, 50%, 90% \(retrieved at none\)"}},
    "kda_state_lost_beyond:1000": {"long": {"*": r"^facts lost at 10%, 50% \(retrieved at 90%\)"}},
    # an image accepted and left out of the prompt; a response_format JSON schema answered with free text
    "image_dropped": {"vision": {"*": r"prompt_tokens grew by 0 with a 448x336 image, 192 predicted \(\+ up to 16 for "
                                     r"the markers\): the image was accepted but is not in the prompt"}},
    "schema_ignored": {"short": {"*": r"structured output \(not streamed\): content is not JSON \(.*: the "
                                      r"response_format JSON schema was not applied"}},
}
# A missing parser is caught both ways (streamed and not), and the answer's raw markers are shown.
PARSER_MARKERS = {"no_reasoning_parser": "<|open|>think", "no_tool_parser": "<|tool_calls_section_begin|>"}
SAID = {("no_reasoning_parser", "sglang"): "no reasoning in `reasoning_content`: the reasoning parser did not split it",
        ("no_reasoning_parser", "vllm"): "no reasoning in `reasoning`: the reasoning parser did not split it off",
        ("no_tool_parser", "sglang"): "no structured tool_calls: the tool-call parser did not run",
        ("no_tool_parser", "vllm"): "no structured tool_calls: the tool-call parser did not run"}
# One launch per group: its faults fail different stages.
GROUPS = (("no_reasoning_parser", "no_prefix_cache", "kda_state_zeroed"),
          ("no_tool_parser", "no_cache_report", "short_context:2600", "image_dropped"),
          ("wrong_cache_state", "kda_state_lost_beyond:1000", "slow_decode", "schema_ignored"))


def expected(group: tuple[str, ...]) -> Expect:
    merged: Expect = {}
    for fault in group:
        for name, patterns in FAULTS[fault].items():
            assert name not in merged, f"{fault} shares the {name} stage with another fault of its group"
            merged[name] = patterns
    return merged


def test_every_fault_is_in_one_group() -> None:
    assert sorted(f for g in GROUPS for f in g) == sorted(FAULTS)


@pytest.mark.parametrize("group", GROUPS, ids=["+".join(g) for g in GROUPS])
@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_each_fault_fails_exactly_its_stage_on_both_dialects(tmp_path: Path, checkpoint: Path, mimic: str,
                                                             group: tuple[str, ...]) -> None:
    want = expected(group)
    name = f"vg-{mimic}-{GROUPS.index(group)}"
    topo = sim_topology(tmp_path, name, checkpoint, mimic=mimic, fault=",".join(group))
    figures.add(figures.FAULTS_INJECTED, len(group))
    with launched(topo):
        report = validate_json(topo, *STAGES)
    stages: dict[str, Any] = {s["name"]: s for s in report["stages"]}
    assert statuses(report) == {s: "fail" if s in want else "pass" for s in STAGES}, \
        {n: (s["status"], s["detail"]) for n, s in stages.items()}
    for stage, patterns in want.items():
        pattern = patterns.get(mimic, patterns.get("*"))
        told = stages[stage]["detail"] + "\n" + (stages[stage].get("evidence") or "")
        assert pattern is not None and re.search(pattern, told, re.MULTILINE), told
    for fault in set(group) & set(PARSER_MARKERS):
        short = stages["short"]["evidence"]
        assert "raw markers in content (" in short and PARSER_MARKERS[fault] in short, short
        for way in ("streamed", "not streamed"):
            assert f"({way}): {SAID[fault, mimic]}" in short, short
    if "vision" not in want:  # the stand-in runs here: the image goes by data URL and by an http URL served here
        assert "a 448x336 PNG accepted as a data URL and by an http URL: prompt_tokens +197 (192 image tokens " \
               "predicted, 5 for the media markers)" == stages["vision"]["detail"], stages["vision"]
    if "slow_decode" in group:
        assert stages["effort"]["results"]["share_of_predicted"]["decode"] < 0.2
