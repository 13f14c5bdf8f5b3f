"""The one JUnit XML writer (junitparser) for preflight and validate: suites of cases, a case per node or
per check/stage, failures and errors carrying every line that explains them."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from k3deploy.errors import InputError
from k3deploy.verdicts.model import Status


@dataclass(frozen=True)
class Case:
    """One JUnit test case: its status, the one-line message and the full text (fix, every problem)."""

    name: str
    classname: str
    status: Status
    message: str
    text: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Suite:
    """One JUnit test suite."""

    name: str
    cases: Sequence[Case]


def write_junit(title: str, suites: Sequence[Suite], path: Path | str) -> None:
    """Write the suites to path; InputError when the file cannot be written (without junitparser the CLI
    names the install, k3deploy.extras)."""
    from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

    result = {"fail": lambda m: Failure(m, type_="failed"), "error": lambda m: Error(m, type_="host error"),
              "skip": lambda m: Skipped(m)}
    xml = JUnitXml(name=title)
    for s in suites:
        suite = TestSuite(s.name)
        for c in s.cases:
            case = TestCase(c.name, classname=c.classname, time=c.seconds)
            if c.status == "pass":
                if c.text or c.message:
                    case.system_out = c.text or c.message
            else:
                case.result = [result[c.status](c.message)]
                if c.text:
                    case.result[0].text = c.text
            suite.add_testcase(case)
        xml.add_testsuite(suite)
    try:
        xml.write(str(path), pretty=True)
    except OSError as exc:
        raise InputError(f"--junit {path}: cannot write ({exc.strerror or exc})") from exc
