"""A validation report as a rich table and as JUnit XML (junitparser: one testcase per stage and node)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.validate.pipeline import NOT_IMPLEMENTED, Report
from k3deploy.verdicts import junit
from k3deploy.verdicts.junit import Case, Suite

if TYPE_CHECKING:
    from rich.console import RenderableType

STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "error": "bold magenta"}


def report_table(report: Report) -> RenderableType:
    """Stages with status, time and detail; the node rows and every problem under a stage that did not pass."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"validate {report.deployment}", title_justify="left", expand=False)
    for column in ("stage", "status", "seconds", "detail"):
        table.add_column(column, overflow="fold", justify="right" if column == "seconds" else "left")
    for stage in report.stages:
        table.add_row(Text(stage.name), Text(stage.status.upper(), style=STYLE[stage.status]), f"{stage.seconds:.1f}",
                      Text(stage.detail))
        for node in stage.nodes if stage.status != "pass" else ():
            lines = node.problems or [node.detail]
            table.add_row(Text(f"  node {node.rank}", style="dim"), Text(node.status, style=STYLE[node.status]), "",
                          Text(f"{node.host}: " + "\n".join(lines)))
    verdict = Text("PASSED" if report.passed else "FAILED", style="bold green" if report.passed else "bold red")
    parts: list[RenderableType] = [table, verdict]
    if report.not_implemented:
        parts.append(Text(f"{NOT_IMPLEMENTED}, not run: {', '.join(report.not_implemented)}", style="dim"))
    return Group(*parts)


def write_junit(report: Report, path: Path | str) -> None:
    """JUnit XML for CI: one testcase per node of each per-node stage, one per stage otherwise."""
    cases = [Case(name, f"k3deploy.validate.{stage.name}", status, detail, text if status != "pass" else "",
                  stage.seconds)
             for stage in report.stages
             for name, status, detail, text in [
                 (f"{stage.name} node {n.rank} ({n.host})", n.status, n.detail, "\n".join(n.problems))
                 for n in stage.nodes] or [(stage.name, stage.status, stage.detail, stage.evidence)]]
    junit.write_junit(f"k3deploy validate {report.deployment}", [Suite(f"k3deploy validate {report.deployment}", cases)], path)
