"""The failure modes the seeds list (000's "Failure modes", 002's section 50 "Local deployment troubleshooting"),
each refused or warned before launch with the seed's reason and the fix (README's failure-mode table)."""
from __future__ import annotations

import pytest

from k3deploy.diagnostics import Issue
from k3deploy.planning.plan import Plan
from tests.unit.plan_helpers import plan_of, topology_dict

pytestmark = pytest.mark.timeout(30)


def issue(plan: Plan, code: str) -> Issue:
    found = [i for i in plan.issues if i.code == code]
    assert found, [i.code for i in plan.issues]
    return found[0]


def test_a_state_pool_that_admits_few_requests_names_each_fix_with_its_numbers() -> None:
    """002 section 50.2 ("Server starts but accepts few requests"): the fixes, each sized again, and the ratio it
    proposes does admit every request asked for."""
    capped = issue(plan_of(topology_dict(max_running_requests=64)), "CONCURRENCY_CAPPED")
    assert capped.severity == "warning" and "holds 47 requests, fewer than max_running_requests 64" in capped.message
    hint = capped.hint or ""
    for fix in ("set serving.mamba_full_memory_ratio: 1.77 (was 0.9): the state pool holds 64 requests",
                "state_dtype: bf16 (validate accuracy first): 91 requests",
                "prefix_cache_strategy: no_buffer (fewer state slots a request): 79 requests",
                "raise attention TP", "cap serving.max_running_requests at 47"):
        assert fix in hint, (fix, hint)
    fixed = plan_of(topology_dict(max_running_requests=64, mamba_full_memory_ratio=1.77))
    assert fixed.capacity is not None and fixed.capacity.max_running_requests == 64
    assert "CONCURRENCY_CAPPED" not in {i.code for i in fixed.issues}


def test_speculation_is_among_the_fixes_when_it_holds_state_slots() -> None:
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, tp=8, ep=1, dcp=8, max_running_requests=256)
    doc["engine"]["args"] = {"--speculative-algorithm": "DSPARK", "--speculative-dspark-block-size": 7}
    hint = issue(plan_of(doc), "CONCURRENCY_CAPPED").hint or ""
    assert "drop the speculative flags (no draft state slots):" in hint


def with_args(args: dict[str, object], **kw: object) -> dict[str, object]:
    doc = topology_dict(**kw)  # type: ignore[arg-type]
    doc["engine"]["args"] = args
    return doc


def test_a_context_past_the_models_is_refused() -> None:
    """002 section 41: the model supports at most 1,048,576 tokens (the catalog's max_position_embeddings)."""
    i = issue(plan_of(topology_dict(context_length=2_000_000)), "CONTEXT_OVER_MODEL")
    assert i.severity == "error" and "1,048,576" in i.message and i.hint and "1,048,576" in i.hint
    assert not plan_of(topology_dict(context_length=2_000_000)).valid  # invalid input: exit 2
    assert "CONTEXT_OVER_MODEL" not in {x.code for x in plan_of(topology_dict(context_length=1_048_576)).issues}
    flag = issue(plan_of(with_args({"--context-length": 2_000_000})), "CONTEXT_OVER_MODEL")
    assert flag.path == "engine.args.--context-length" and flag.severity == "error"


@pytest.mark.parametrize(("kind", "flag", "value"), [
    ("sglang", "--json-model-override-args", '{"rope_scaling": {"type": "yarn", "factor": 4}}'),
    ("sglang", "--json-model-override-args", '{"text_config": {"rope_theta": 50000}}'),
    ("vllm", "--hf-overrides", '{"rope_scaling": {"rope_type": "yarn"}}'),
])
def test_a_rope_override_on_the_nope_model_is_refused(kind: str, flag: str, value: str) -> None:
    """000 failure modes: "Applying RoPE scaling. The MLA layers use NoPE" (the catalog's full_attn_position)."""
    i = issue(plan_of(with_args({flag: value}, kind=kind)), "ROPE_OVERRIDE_NOPE")
    assert i.severity == "error" and "NoPE" in i.message and i.path == f"engine.args.{flag}" and i.hint
    assert not plan_of(with_args({flag: value}, kind=kind)).valid  # exit 2
    other = plan_of(with_args({flag: '{"max_window_layers": 3}'}, kind=kind))
    assert "ROPE_OVERRIDE_NOPE" not in {x.code for x in other.issues}


@pytest.mark.parametrize(("kind", "flag", "value", "code"), [
    ("sglang", "--moe-runner-backend", "triton", "SGLANG_HOPPER_MOE_AUTO"),
    ("sglang", "--moe-runner-backend", "auto", "SGLANG_HOPPER_MOE_AUTO"),
    ("vllm", "--moe-backend", "triton", "VLLM_HOPPER_MOE"),
    ("vllm", "--moe-backend", "emulation", "VLLM_HOPPER_MOE"),
])
def test_a_moe_backend_that_falls_back_to_bf16_on_hopper_is_refused(kind: str, flag: str, value: str,
                                                                   code: str) -> None:
    """000: "OOM at load because the MoE kernel fell back": the BF16 weights against usable memory, and the fix."""
    i = issue(plan_of(with_args({flag: value}, kind=kind)), code)
    assert i.severity == "error" and "out of memory at load" in i.message and "GiB" in i.message
    assert i.hint and "marlin" in i.hint
    assert code not in {x.code for x in plan_of(with_args({flag: "marlin"}, kind=kind)).issues}


def test_a_vllm_topology_leaving_max_num_seqs_to_the_engine_is_refused() -> None:
    plan = plan_of(topology_dict(kind="vllm", max_running_requests=None))
    assert issue(plan, "VLLM_MAX_NUM_SEQS").severity == "error" and not plan.valid


def test_a_distributed_init_timeout_shorter_than_the_load_warns() -> None:
    """000: "Distributed init timeout. The default is far too short for a 1.45 TiB multi-node load"."""
    doc = topology_dict()
    doc["launch"] = {"dist_timeout_s": 300}
    i = issue(plan_of(doc), "DIST_TIMEOUT_SHORT")
    assert i.severity == "warning" and "300" in i.message and i.hint == \
        "set launch.dist_timeout_s: 3600 (the cookbook's --dist-timeout)"
    assert "DIST_TIMEOUT_SHORT" not in {x.code for x in plan_of(topology_dict()).issues}


@pytest.mark.parametrize(("args", "why", "fix"), [
    ({"--speculative-algorithm": "EAGLE3"}, "no --speculative-num-steps", "set --speculative-num-steps"),
    ({"--speculative-algorithm": "DSPARK"}, "no --speculative-dspark-block-size", "set --speculative-dspark-block"),
    ({"--speculative-algorithm": "NGRAM", "--speculative-num-steps": 3}, "the catalog has no ngram draft", "DSPARK"),
])
def test_a_draft_the_plan_cannot_size_warns(args: dict[str, object], why: str, fix: str) -> None:
    """A draft without its token count, or of a method the catalog has no draft for: no draft memory in the
    budget, said so with the fix."""
    i = issue(plan_of(with_args(args, gpu="b300", per_node=8, nodes=1, tp=8, ep=8)), "SPEC_DRAFT_UNBUDGETED")
    assert i.severity == "warning" and "counts no draft" in i.message and why in i.message
    assert i.hint and fix in i.hint


def test_the_technical_reports_eagle3_draft_is_budgeted_like_dspark() -> None:
    """The EAGLE-3 draft (seed 002 section 27): its weights per attention-TP rank, its own KV per token and the
    verify's extra state slots, as DSpark's are; nothing warned."""
    from k3deploy.catalog.loader import load_catalog

    kw: dict[str, object] = {"gpu": "b300", "per_node": 8, "nodes": 1, "tp": 8, "ep": 8}
    base = plan_of(with_args({}, **kw)).memory
    plan = plan_of(with_args({"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3}, **kw))
    m, draft = plan.memory, load_catalog().model("kimi-k3").eagle3_draft
    assert base is not None and m is not None and draft is not None
    assert "SPEC_DRAFT_UNBUDGETED" not in {i.code for i in plan.issues}
    assert m.draft_weights_bytes == -(-draft.weights_bytes // 8) and m.draft_kv_bytes_per_token == 1152
    assert m.draft_slots == 4 and m.kv_tokens < base.kv_tokens


@pytest.mark.parametrize(("config", "code", "says", "fix"), [
    ({"method": "dspark", "model": "/models/Kimi-K3-DSpark-Block5", "num_speculative_tokens": 7},
     "SPEC_DRAFT_TOKENS", "Inferact/Kimi-K3-DSpark-Block5 is trained for 5 draft tokens per step",
     "set num_speculative_tokens to 5 (seed 004 section 3.1"),
    ({"method": "eagle3", "model": "/models/Kimi-K3-DSpark", "num_speculative_tokens": 7},
     "SPEC_DRAFT_METHOD", "RadixArk/Kimi-K3-DSpark is a dspark draft, the flags run it as eagle3",
     "set the method to dspark"),
])
def test_a_draft_run_against_what_its_checkpoint_expects_is_refused(config: dict[str, object], code: str,
                                                                     says: str, fix: str) -> None:
    """Seed 004 section 3.1: each DSpark draft with the num_speculative_tokens its checkpoint takes."""
    import json

    plan = plan_of(with_args({"--speculative-config": json.dumps(config)}, gpu="b300", per_node=8, nodes=1, tp=8,
                             ep=8, kind="vllm"))
    i = issue(plan, code)
    assert i.severity == "error" and says in i.message and i.hint and fix in i.hint
    assert not plan.valid  # a setting the draft cannot take: exit 2


def test_another_models_draft_is_refused_naming_its_tokenizer() -> None:
    """A draft is the target's (seed 004 FAQ: matching architecture, tokenizer and quantization variant)."""
    import json

    from k3deploy.catalog.loader import load_catalog
    from k3deploy.planning.drafts import draft_issues

    cat = load_catalog()
    k3 = cat.model("kimi-k3")
    other = k3.model_copy(update={"id": "kimi-k2-demo", "hub_repo": "moonshotai/Kimi-K2-demo", "draft_checkpoints": (
        k3.draft_checkpoints[0].model_copy(update={"hub_repo": "lightseekorg/kimi-k2.5-eagle3", "method": "eagle3",
                                                   "num_speculative_tokens": 3}),)})
    cat = cat.model_copy(update={"models": {**cat.models, other.id: other}})
    args = {"--speculative-config": json.dumps({"method": "eagle3", "model": "/m/kimi-k2.5-eagle3",
                                                "num_speculative_tokens": 3})}
    (i,) = [x for x in draft_issues(args, cat, k3, "vllm") if x.code == "SPEC_DRAFT_TARGET"]
    assert i.severity == "error" and "lightseekorg/kimi-k2.5-eagle3, kimi-k2-demo's draft: its tokenizer" in i.message
    assert i.hint == ("use a draft of kimi-k3 (RadixArk/Kimi-K3-DSpark, Inferact/Kimi-K3-DSpark, "
                      "Inferact/Kimi-K3-DSpark-Block5)")


def test_cuda_ipc_feature_transport_across_nodes_is_refused() -> None:
    """002 section 37.2: --mm-feature-transport cuda_ipc is single-node."""
    i = issue(plan_of(with_args({"--mm-feature-transport": "cuda_ipc"})), "MM_CUDA_IPC_MULTINODE")
    assert i.severity == "error" and i.hint and "cpu" in i.hint
    assert not plan_of(with_args({"--mm-feature-transport": "cuda_ipc"})).valid  # exit 2
    one = plan_of(with_args({"--mm-feature-transport": "cuda_ipc"}, gpu="b300", per_node=8, nodes=1, tp=8, ep=8))
    assert "MM_CUDA_IPC_MULTINODE" not in {x.code for x in one.issues}


def test_prefix_caching_off_warns() -> None:
    """000: "Prefix caching silently disabled"; 002 section 50.3 (slow time to first token)."""
    i = issue(plan_of(topology_dict(prefix_cache=False)), "PREFIX_CACHE_OFF")
    assert i.severity == "warning" and i.hint == "set serving.prefix_cache: true"


@pytest.mark.parametrize(("kind", "args"), [
    ("sglang", {"--tool-call-parser": None}), ("sglang", {"--reasoning-parser": "deepseek-r1"}),
    ("vllm", {"--enable-auto-tool-choice": None})])
def test_dropping_the_k3_parsers_warns(kind: str, args: dict[str, object]) -> None:
    """002 sections 50.6 (tool calls appear as text) and 50.7 (reasoning inside the final content)."""
    i = issue(plan_of(with_args(args, kind=kind)), "PARSER_NOT_K3")
    assert i.severity == "warning" and "section 50." in i.message and i.hint
