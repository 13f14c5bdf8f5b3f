"""The shipped example catalog loads and is usable from a topology."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.planning.files import catalog_for

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[2]


def test_example_catalog_loads() -> None:
    cat = catalog_for([ROOT / "examples" / "catalog"])
    hw = cat.gpu("h100-80gb-mig-reserved")
    assert hw.usable_gib == 77.19 and "h100-80gb" in cat.hardware
