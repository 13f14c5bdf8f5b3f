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
    for fix in ("set serving.mamba_full_memory_ratio: 1.745 (was 0.9): the state pool holds 64 requests",
                "state_dtype: bf16 (validate accuracy first): 92 requests",
                "prefix_cache_strategy: no_buffer (fewer state slots a request): 79 requests",
                "raise attention TP", "cap serving.max_running_requests at 47"):
        assert fix in hint, (fix, hint)
    fixed = plan_of(topology_dict(max_running_requests=64, mamba_full_memory_ratio=1.745))
    assert fixed.capacity is not None and fixed.capacity.max_running_requests == 64
    assert "CONCURRENCY_CAPPED" not in {i.code for i in fixed.issues}


def test_speculation_is_among_the_fixes_when_it_holds_state_slots() -> None:
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, tp=8, ep=1, dcp=8, max_running_requests=256)
    doc["engine"]["args"] = {"--speculative-algorithm": "DSPARK", "--speculative-dspark-block-size": 7}
    hint = issue(plan_of(doc), "CONCURRENCY_CAPPED").hint or ""
    assert "drop the speculative flags (no draft state slots):" in hint
