"""Preflight reports for people (a rich table of checks x nodes, then every failure with its fix; a service:
one table per instance, then the router's) and for CI (JUnit XML: one test case per check and node)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from k3deploy.preflight.report import CheckResult, Report, failure_line
from k3deploy.verdicts import junit
from k3deploy.verdicts.junit import Case, Suite

MARK = {"pass": ("ok", "green"), "fail": ("FAIL", "bold red"), "skip": ("skip", "dim"), "error": ("ERROR", "bold magenta")}


def table(report: Report) -> RenderableType:
    """Checks as rows, nodes as columns; failures listed below with their fixes; measurements last. A
    service: each instance so, named, then the service's own checks; one verdict over all of them."""
    parts: list[RenderableType] = []
    for part in report.parts():
        if part.checks:
            parts += _part(part)
    verdict = {0: "preflight passed", 1: "preflight FAILED", 3: "preflight could not reach every node"}
    parts.append(Text(f"{verdict[report.exit_code]} in {report.elapsed_s:.1f} s", style="bold"))
    return Group(*parts)


def _part(report: Report) -> list[RenderableType]:
    """One deployment's (or instance's) table, failures, skips and measurements."""
    ranks = sorted({v.rank for c in report.checks for v in c.verdicts})
    hosts = {v.rank: v.host for c in report.checks for v in c.verdicts}
    named = f" ({report.instance})" if report.instance else " (the router's machine)" if report.instances else ""
    t = Table(title=f"preflight {report.name}{named}", title_justify="left")
    t.add_column("check")
    for r in ranks:
        t.add_column(f"{r} {hosts[r]}", justify="center")
    for c in report.checks:
        by_rank = {v.rank: v for v in c.verdicts}
        cells = [Text(*MARK[by_rank[r].status]) if r in by_rank else Text("") for r in ranks]
        t.add_row(c.name, *cells)
    parts: list[RenderableType] = [t]
    for c in report.checks:
        for v in c.failures():
            line = Text(failure_line(report, c.name, v), style="bold")
            if v.fix:
                line.append(f"\n  fix: {v.fix}", style="yellow")
            parts.append(line)
    where = f"{report.instance}: " if report.instance else ""
    skipped = {c.name: c.verdicts[0].detail for c in report.checks if c.status == "skip" and c.verdicts}
    for name, why in skipped.items():
        parts.append(Text(f"{where}{name}: skipped: {why}", style="dim"))
    for rank, m in sorted(report.measurements.items()):
        for backend, res in m.items():
            if isinstance(res, dict):
                parts.append(Text(f"{where}rendezvous rank {rank} ({hosts[rank]}): {backend} all_reduce "
                                  f"{res['bytes'] / 2**20:.0f} MiB in {res['seconds'] * 1e3:.1f} ms, algbw "
                                  f"{res['algbw_gbps']:.3f} GB/s, busbw {res['busbw_gbps']:.3f} GB/s "
                                  f"(probe {m['elapsed_s']:.1f} s)"))
    return parts


def write_junit(report: Report, path: Path) -> None:
    """JUnit XML: a suite per check, a case per node (failure, error or skipped with the detail and fix); a
    service: a suite per instance (and one for the service's own checks), a case per check and node."""
    if not report.instances:
        suites = [Suite(f"preflight.{c.name}", _cases(report, c, service=False)) for c in report.checks]
    else:
        suites = [Suite(f"preflight.{p.name}", [case for c in p.checks for case in _cases(p, c, service=True)])
                  for p in report.parts() if p.checks]
    junit.write_junit(f"k3deploy preflight {report.name}", suites, path)


def _cases(report: Report, c: CheckResult, *, service: bool) -> list[Case]:
    """One check's cases, one per node (in a service's suites: the instance and the check in each name)."""
    prefix = f"{report.instance + ': ' if report.instance else ''}{c.name}: " if service else ""
    classname = f"preflight.{report.name}.{c.name}" if service else f"preflight.{c.name}"
    return [Case(f"{prefix}rank {v.rank} ({v.host})", classname, v.status, v.detail,
                 v.detail + (f"\nfix: {v.fix}" if v.fix else ""), c.elapsed_s) for v in c.verdicts]
