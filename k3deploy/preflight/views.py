"""Preflight reports for people (a rich table of checks x nodes, then every failure with its fix) and for
CI (JUnit XML: one test case per check and node)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from k3deploy.preflight.report import Report
from k3deploy.verdicts import junit
from k3deploy.verdicts.junit import Case, Suite

MARK = {"pass": ("ok", "green"), "fail": ("FAIL", "bold red"), "skip": ("skip", "dim"), "error": ("ERROR", "bold magenta")}


def table(report: Report) -> RenderableType:
    """Checks as rows, nodes as columns; failures listed below with their fixes; measurements last."""
    ranks = sorted({v.rank for c in report.checks for v in c.verdicts})
    hosts = {v.rank: v.host for c in report.checks for v in c.verdicts}
    t = Table(title=f"preflight {report.name}", title_justify="left")
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
            line = Text(f"{c.name}: rank {v.rank} ({v.host}): ", style="bold")
            line.append(v.detail)
            if v.fix:
                line.append(f"\n  fix: {v.fix}", style="yellow")
            parts.append(line)
    skipped = {c.name: c.verdicts[0].detail for c in report.checks if c.status == "skip" and c.verdicts}
    for name, why in skipped.items():
        parts.append(Text(f"{name}: skipped: {why}", style="dim"))
    for rank, m in sorted(report.measurements.items()):
        for backend, res in m.items():
            if isinstance(res, dict):
                parts.append(Text(f"rendezvous rank {rank} ({hosts[rank]}): {backend} all_reduce "
                                  f"{res['bytes'] / 2**20:.0f} MiB in {res['seconds'] * 1e3:.1f} ms, algbw "
                                  f"{res['algbw_gbps']:.3f} GB/s, busbw {res['busbw_gbps']:.3f} GB/s "
                                  f"(probe {m['elapsed_s']:.1f} s)"))
    verdict = {0: "preflight passed", 1: "preflight FAILED", 3: "preflight could not reach every node"}
    parts.append(Text(f"{verdict[report.exit_code]} in {report.elapsed_s:.1f} s", style="bold"))
    return Group(*parts)


def write_junit(report: Report, path: Path) -> None:
    """JUnit XML: a suite per check, a case per node (failure, error or skipped with the detail and fix)."""
    suites = [Suite(f"preflight.{c.name}", [
        Case(f"rank {v.rank} ({v.host})", f"preflight.{c.name}", v.status, v.detail,
             v.detail + (f"\nfix: {v.fix}" if v.fix else ""), c.elapsed_s) for v in c.verdicts])
        for c in report.checks]
    junit.write_junit(f"k3deploy preflight {report.name}", suites, path)
