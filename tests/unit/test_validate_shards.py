"""The shards stage and the pipeline around it, over real per-node checkpoints and real probe subprocesses."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from k3deploy.checkpoint.manifest import Manifest
from k3deploy.errors import InputError
from k3deploy.validate.pipeline import Report
from k3deploy.validate.report import write_junit
from k3deploy.validate.run import resolve_target, validate
from k3deploy.validate.stage import STAGE_NAMES, ProgressEvent, StageResult
from k3deploy.validate.stages import IMPLEMENTED
from tests.validate_nodes import FAULT_SHARD, LocalNodes, topology_file, write_nodes

pytestmark = pytest.mark.timeout(180)
CKPT = "/models/kimi-k3-tiny"
SHARD = f"shard {FAULT_SHARD:05d}"
SEEDED = ["clean", "truncate", "flip", "missing-tensor", "wrong-dtype", "revision", "clean"]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    return write_nodes(tmp_path_factory.mktemp("nodes"), SEEDED)


def run(tmp: Path, roots: dict[int, Path], **kwargs: object) -> tuple[Report, LocalNodes]:
    nodes = LocalNodes(roots, CKPT, dead=kwargs.pop("dead", ()))  # type: ignore[arg-type]
    topo = topology_file(tmp, "t", len(roots), CKPT)
    return validate(resolve_target(str(topo)), nodes.factory(), **kwargs), nodes  # type: ignore[arg-type]


def rows(report: Report) -> dict[int, tuple[str, list[str]]]:
    return {n.rank: (n.status, n.problems) for n in report.stages[0].nodes}


def test_clean_nodes_pass_with_progress_and_the_json_contract(tmp_path: Path, seeded: dict[int, Path]) -> None:
    events: list[ProgressEvent] = []
    report, nodes = run(tmp_path, {0: seeded[0], 1: seeded[6]}, progress=events.append)
    assert report.passed and report.exit_code == 0
    assert report.not_implemented == [n for n in STAGE_NAMES if n not in IMPLEMENTED]
    doc = report.model_dump()
    assert set(doc) >= {"deployment", "passed", "stages"} and doc["deployment"] == "t"
    stage = doc["stages"][0]
    assert set(stage) >= {"name", "status", "detail", "seconds", "nodes", "evidence"} and stage["status"] == "pass"
    assert [(n["rank"], n["host"], n["status"]) for n in stage["nodes"]] == [(0, "node0", "pass"), (1, "node1", "pass")]
    assert stage["nodes"][0]["detail"].startswith("4 shards, ")
    assert "digests equal to each other (no manifest)" in stage["detail"]
    assert all(e.stage == "shards" and e.total > 0 for e in events)
    assert nodes.calls and nodes.calls[0][1] > 300  # the timeout budgets hashing the catalog's bytes


def test_every_seeded_fault_is_caught_on_its_node_against_the_manifest(tmp_path: Path, seeded: dict[int, Path]) -> None:
    manifest = Manifest.load(seeded[0])
    report, _ = run(tmp_path, seeded, manifest=manifest)
    assert not report.passed and report.exit_code == 1 and report.stages[0].status == "fail"
    found = rows(report)
    assert [r for r, (status, _) in found.items() if status == "fail"] == [1, 2, 3, 4, 5]
    assert found[0] == ("pass", []) and found[6] == ("pass", [])
    expected = {
        1: rf"{SHARD}: [\d,]+ bytes short \(file [\d,]+, header says [\d,]+\)",
        2: rf"{SHARD}: sha256 [0-9a-f]{{12}}… differs from the manifest's [0-9a-f]{{12}}…",
        3: rf"{SHARD}: tensor language_model\.\S+\.weight_scale missing from {SHARD}",
        4: rf"{SHARD}: tensor \S+: dtype F16, expected BF16",
        5: r"revision tiny-r2, the manifest's is tiny-r1; 4 files differ: shard 00001, shard 00002, shard 00003, "
           r"shard 00004",
    }
    for rank, pattern in expected.items():
        assert any(re.fullmatch(pattern, p) for p in found[rank][1]), (rank, found[rank][1])
    assert "node 1 (node1):" in report.stages[0].detail


def test_without_a_manifest_nodes_are_compared_with_each_other(tmp_path: Path, seeded: dict[int, Path]) -> None:
    report, _ = run(tmp_path, {0: seeded[0], 1: seeded[2], 2: seeded[6], 3: seeded[5], 4: seeded[0]})
    found = rows(report)
    assert found[1] == ("fail", [f"{SHARD} differs from the 3 others"])
    assert found[3] == ("fail", [("revision tiny-r2 vs tiny-r1 on 3 others; 4 files differ: shard 00001, shard 00002, "
                                 "shard 00003, shard 00004")])
    assert {r for r, (s, _) in found.items() if s == "pass"} == {0, 2, 4}


def test_an_unreachable_node_is_an_error_naming_it(tmp_path: Path, seeded: dict[int, Path]) -> None:
    report, _ = run(tmp_path, {0: seeded[0], 1: seeded[6]}, dead=[1])
    assert report.exit_code == 3 and report.stages[0].status == "error"
    assert rows(report)[1] == ("error", ["node1: connection refused"])


def test_junit_has_one_failing_testcase_per_faulty_node(tmp_path: Path, seeded: dict[int, Path]) -> None:
    from junitparser import Failure, JUnitXml

    report, _ = run(tmp_path, seeded, manifest=Manifest.load(seeded[0]), only=["shards"])
    write_junit(report, tmp_path / "junit.xml")
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "junit.xml"))))
    cases = [c for c in suite if c.name.startswith("shards ")]  # stages needing a deployment: one skipped case
    assert len(cases) == len(SEEDED)
    failing = {c.name: c.result[0] for c in cases if c.result}
    assert sorted(failing) == [f"shards node {r} (node{r})" for r in range(1, 6)]
    assert all(isinstance(r, Failure) for r in failing.values())
    assert "bytes short" in (failing["shards node 1 (node1)"].message or "")


def test_selection_over_the_fixed_order(tmp_path: Path, seeded: dict[int, Path]) -> None:
    roots = {0: seeded[0]}
    for lacking in [n for n in STAGE_NAMES if n not in IMPLEMENTED][:1]:
        with pytest.raises(InputError, match=rf"stage {lacking}: not implemented in this version of k3deploy"):
            run(tmp_path, roots, only=[lacking])
    with pytest.raises(InputError, match=r"--from: no stage named 'shard' \(did you mean shards\?\)"):
        run(tmp_path, roots, start="shard")
    with pytest.raises(InputError, match="nothing to run"):
        run(tmp_path, roots, skip=list(IMPLEMENTED))
    with pytest.raises(InputError, match="nothing to run"):
        run(tmp_path, roots, start=STAGE_NAMES[-1], skip=list(IMPLEMENTED))
    later, _ = run(tmp_path, roots, start="kernels")  # without a deployment the request stages skip
    assert [(s.name, s.status) for s in later.stages] == [(n, "skip") for n in IMPLEMENTED if n != "shards"]
    assert later.not_implemented == [n for n in STAGE_NAMES[1:] if n not in IMPLEMENTED]
    with pytest.raises(InputError, match="do not combine"):
        run(tmp_path, roots, only=["shards"], start="shards")
    report, _ = run(tmp_path, roots, only=["shards"])
    assert [s.name for s in report.stages] == ["shards"] and report.not_implemented == []


def test_stages_needing_a_deployment_skip_and_fail_fast_stops_the_rest(tmp_path: Path, seeded: dict[int, Path]) -> None:
    from k3deploy.catalog.loader import load_catalog
    from k3deploy.validate.pipeline import run_pipeline
    from k3deploy.validate.stage import NodeRef, ValidateContext
    from k3deploy.validate.stages import IMPLEMENTED

    class NeedsDeployment:
        """A test stage: would fail loudly if run without a deployment."""

        name, needs_deployment = "short", True

        def run(self, ctx: object) -> StageResult:
            raise AssertionError("must not run without a deployment")

    target = resolve_target(str(topology_file(tmp_path, "t", 1, CKPT)))
    assert target.deployment is None  # nothing recorded for this topology
    ctx = ValidateContext(name="t", topology=target.topology, model=load_catalog().model("kimi-k3-tiny"),
                          nodes=[NodeRef(0, "node0")], fleet=LocalNodes({0: seeded[1]}, CKPT))
    skipped = run_pipeline(ctx, [NeedsDeployment()])
    assert skipped.stages[0].status == "skip" and "needs a running deployment" in skipped.stages[0].detail
    assert skipped.passed and skipped.exit_code == 0
    seen: list[str] = []
    stopped = run_pipeline(ctx, [IMPLEMENTED["shards"], NeedsDeployment()], fail_fast=True,
                           on_stage=lambda n, r: seen.append(f"{n}:{r.status if r else 'start'}"))
    assert [s.status for s in stopped.stages] == ["fail", "skip"]
    assert stopped.stages[1].detail == "not run: --fail-fast after shards failed"
    assert seen == ["shards:start", "shards:fail", "short:start", "short:skip"]


def test_a_node_without_the_checkpoint_directory_fails_naming_the_path(tmp_path: Path, seeded: dict[int, Path]) -> None:
    report, _ = run(tmp_path, {0: seeded[0], 1: tmp_path / "nowhere"})
    status, problems = rows(report)[1]
    assert status == "fail" and problems == [f"{tmp_path / 'nowhere'}: no such directory"]
    assert rows(report)[0][0] == "pass"


def test_a_deployment_name_resolves_to_its_topology_and_only_a_ready_one_counts(tmp_path: Path) -> None:
    from k3deploy.errors import StateError
    from k3deploy.records.store import StateStore
    from tests.unit.test_state import record

    topo = topology_file(tmp_path, "named", 1, CKPT)
    store = StateStore(tmp_path / "state")
    store.save(record("named").model_copy(update={"file": str(topo), "status": "ready"}))
    found = resolve_target("named", str(tmp_path / "state"))
    assert found.file == topo and found.topology.name == "named"
    assert found.deployment is not None and found.deployment.status == "ready"
    assert resolve_target(str(topo)).deployment is not None  # the file finds its running deployment too
    store.save(record("named").model_copy(update={"file": str(topo), "status": "stopped"}))
    assert resolve_target("named", str(tmp_path / "state")).deployment is None
    topo.unlink()
    with pytest.raises(StateError, match="was launched from .*named.yaml, which is gone"):
        resolve_target("named", str(tmp_path / "state"))
