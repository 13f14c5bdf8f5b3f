"""Fixtures for integration tests: fake multi-host rigs (network namespaces + sshd), root only."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# `tests.rig` is imported as a package from the repo root, whatever way pytest was started.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.rig import HostRig

NEEDS_ROOT = "the multi-host rig needs root (network namespaces)"


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip(NEEDS_ROOT)


def named_rig(prefix: str, hosts: int = 4) -> Iterator[HostRig]:
    """A rig whose namespaces carry `prefix`, apart from other modules' rigs (for a module-scoped fixture)."""
    _require_root()
    with HostRig(hosts, prefix=prefix) as rig:
        yield rig


@pytest.fixture
def root_only() -> None:
    """Skip the test unless running as root."""
    _require_root()


@pytest.fixture(scope="module")
def rig4() -> Iterator[HostRig]:
    """Four hosts h01..h04, shared by the tests of one module."""
    _require_root()
    with HostRig(4) as rig:
        yield rig


@pytest.fixture
def make_rig() -> Iterator[Callable[..., HostRig]]:
    """Factory `make_rig(n, **kwargs)`; every rig it made is closed after the test."""
    _require_root()
    made: list[HostRig] = []

    def make(n: int, **kwargs: Any) -> HostRig:
        rig = HostRig(n, **kwargs)
        made.append(rig)
        return rig

    yield make
    for rig in reversed(made):
        rig.close()
