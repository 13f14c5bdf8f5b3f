"""`plan --search` pairs engine, model and accelerator as `plan FILE` does (rules.pairing_issues)."""
from __future__ import annotations

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.errors import InputError
from k3deploy.planning.search import default_pairing, search_shapes

pytestmark = pytest.mark.timeout(30)


def test_ascend_defaults_to_vllm_ascend_with_the_w4a8_model() -> None:
    cat = load_catalog()
    assert default_pairing(cat, "ascend-a3", None, None) == ("vllm-ascend", "kimi-k3-w4a8")
    assert default_pairing(cat, "h100-80gb", None, None) == ("sglang", "kimi-k3")
    rows = search_shapes(cat, model_id="kimi-k3-w4a8", hardware_id="ascend-a3", gpus=64, family="vllm",
                         engine_id="vllm-ascend")
    assert any(r.feasible for r in rows)


@pytest.mark.parametrize(("engine", "family", "model", "code"), [
    ("sglang", "sglang", "kimi-k3-w4a8", "ENGINE_HARDWARE"),
    ("vllm-ascend", "vllm", "kimi-k3", "ASCEND_NEEDS_W4A8"),
])
def test_a_pairing_plan_refuses_is_refused_by_search(engine: str, family: str, model: str, code: str) -> None:
    with pytest.raises(InputError, match=code):
        search_shapes(load_catalog(), model_id=model, hardware_id="ascend-a3", gpus=64, family=family,  # type: ignore[arg-type]
                      engine_id=engine)
