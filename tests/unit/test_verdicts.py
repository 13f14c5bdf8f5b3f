"""The one report model of preflight and validate: statuses, exit codes, the JUnit writer, runner timing."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from k3deploy.errors import ExecError, InputError
from k3deploy.preflight.report import CheckResult, Verdict
from k3deploy.preflight.report import Report as PreflightReport
from k3deploy.validate.pipeline import run_pipeline
from k3deploy.validate.stage import StageResult
from k3deploy.verdicts.junit import Case, Suite, write_junit
from k3deploy.verdicts.model import EXIT_FAILED, EXIT_HOST, EXIT_OK, NodeRow, exit_code, worst


def test_one_row_model_for_both() -> None:
    assert Verdict is NodeRow  # preflight's verdicts and validate's node rows are one model
    row = NodeRow(rank=1, host="h", status="fail", detail="bad", fix="do this", problems=["bad", "worse"])
    assert row.model_dump() == {"rank": 1, "host": "h", "status": "fail", "detail": "bad", "fix": "do this",
                                "problems": ["bad", "worse"]}


def test_worst_and_the_two_exit_code_orders() -> None:
    assert worst([]) == "skip" and worst(["skip", "pass"]) == "pass"
    assert worst(["pass", "fail", "skip"]) == "fail" and worst(["fail", "error"]) == "error"
    for first in (True, False):
        assert exit_code(["pass", "skip"], unreachable_first=first) == EXIT_OK
        assert exit_code(["pass", "fail"], unreachable_first=first) == EXIT_FAILED
        assert exit_code(["skip", "error"], unreachable_first=first) == EXIT_HOST
    # preflight: a node it could not ask may hide any failure; validate: a failure is a finding regardless
    assert exit_code(["fail", "error"], unreachable_first=True) == EXIT_HOST
    assert exit_code(["fail", "error"], unreachable_first=False) == EXIT_FAILED


def test_junit_cases_carry_status_message_and_every_line(tmp_path: Path) -> None:
    from junitparser import Error, Failure, JUnitXml, Skipped

    cases = [Case("a", "k.a", "pass", "fine", seconds=1.5), Case("b", "k.b", "fail", "bad", "bad\nfix: do it"),
             Case("c", "k.c", "error", "unreachable", "ssh said no"), Case("d", "k.d", "skip", "not here")]
    write_junit("title", [Suite("s1", cases[:2]), Suite("s2", cases[2:])], tmp_path / "j.xml")
    xml = JUnitXml.fromfile(str(tmp_path / "j.xml"))
    got = {c.name: c for s in xml for c in s}
    assert [s.name for s in xml] == ["s1", "s2"] and xml.name == "title"
    assert got["a"].is_passed and got["a"].time == 1.5 and got["a"].system_out == "fine"
    fail, error, skip = got["b"].result[0], got["c"].result[0], got["d"].result[0]
    assert isinstance(fail, Failure) and (fail.message, fail.text) == ("bad", "bad\nfix: do it")
    assert isinstance(error, Error) and (error.message, error.text) == ("unreachable", "ssh said no")
    assert isinstance(skip, Skipped) and skip.message == "not here"
    with pytest.raises(InputError, match="cannot write"):
        write_junit("t", [], tmp_path / "no" / "such" / "dir" / "j.xml")


def test_preflight_checks_and_validate_stages_write_through_the_one_writer(tmp_path: Path) -> None:
    from junitparser import JUnitXml

    from k3deploy.preflight.views import write_junit as preflight_junit
    from k3deploy.validate.pipeline import Report
    from k3deploy.validate.report import write_junit as validate_junit

    row = NodeRow(rank=0, host="h", status="fail", detail="bad", fix="fix it")
    preflight_junit(PreflightReport(name="d", checks=(CheckResult(name="c", title="C", asks="?", verdicts=(row,),
                                                                  elapsed_s=2.0),), elapsed_s=2.0), tmp_path / "p.xml")
    stage = StageResult(name="shards", status="fail", detail="1 node", seconds=3.0,
                        nodes=[row.model_copy(update={"problems": ["bad", "worse"]})])
    validate_junit(Report(deployment="d", passed=False, exit_code=1, stages=[stage]), tmp_path / "v.xml")
    p = next(c for s in JUnitXml.fromfile(str(tmp_path / "p.xml")) for c in s)
    v = next(c for s in JUnitXml.fromfile(str(tmp_path / "v.xml")) for c in s)
    assert (p.name, p.classname, p.time, p.result[0].message, p.result[0].text) == \
        ("rank 0 (h)", "preflight.c", 2.0, "bad", "bad\nfix: fix it")
    assert (v.name, v.classname, v.time, v.result[0].message, v.result[0].text) == \
        ("shards node 0 (h)", "k3deploy.validate.shards", 3.0, "bad", "bad\nworse")


class _Slow:
    """A stage that takes at least `sleep_s` and reports no time of its own."""

    needs_deployment = False

    def __init__(self, name: str, outcome: StageResult | ExecError, sleep_s: float) -> None:
        self.name, self.outcome, self.sleep_s = name, outcome, sleep_s

    def run(self, ctx: Any) -> StageResult:
        time.sleep(self.sleep_s)
        if isinstance(self.outcome, ExecError):
            raise self.outcome
        return self.outcome


def test_the_pipeline_times_every_stage_it_runs() -> None:
    ok = StageResult(name="shards", status="pass", detail="fine")
    stages = [_Slow("shards", ok, 0.2), _Slow("kernels", ExecError("n1: unreachable"), 0.1)]
    ctx: Any = type("Ctx", (), {"name": "d", "deployment": None})()
    first, second = run_pipeline(ctx, stages).stages
    assert ok.seconds == 0.0  # the stage's own result carries no time; the pipeline's copy does
    assert first.status == "pass" and first.seconds >= 0.2  # a lower bound only: sleep takes at least that
    assert second.status == "error" and second.seconds >= 0.1 and "unreachable" in second.detail
