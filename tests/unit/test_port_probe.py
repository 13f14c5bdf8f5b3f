"""Who holds a port, on one line: a holder's command line with newlines, control characters or great length
(argv is anyone's to choose) is shown escaped and cut, in the probe's answer and in the checks' messages."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from k3deploy.executors.fleet import NodeOutcome
from k3deploy.preflight import rendezvous, router_check
from k3deploy.probes import port_probe
from tests.k3deploy_cli import run_k3deploy as cli
from tests.unit.test_launch_support import fake_topology

# What a node's probe could answer for a holder started as `python3 -c '<two lines>' $'\e[31mred' <long>`.
HOSTILE = "pid 4242 (python3 -c import socket\nsocket.socket().listen()\r\x1b[31mred\x00\t" + "x" * 300 + ")"
# A program that holds a loopback port; its argv (the program text and its arguments) has a newline and an ESC.
SQUATTER = ("import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(120)\n")


class AnswerFleet:
    """A fleet whose nodes all answer the port probe with `answer` (records what was asked)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer, self.asked = answer, []

    def run_probe(self, module: object, args: Any = (), *, ranks: Any = None, args_for: Any = None,
                  **_: Any) -> dict[int, NodeOutcome[Any]]:
        self.asked.append(module)
        chosen = [0] if ranks is None else list(ranks)
        return {r: NodeOutcome(rank=r, host=f"h{r}", value=dict(self.answer)) for r in chosen}


def _one_line_cut(text: str) -> None:
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\x00" not in text, repr(text)
    assert text.isprintable(), repr(text)
    assert "\u2026" in text and len(text) < 300, text


def test_a_hostile_holder_is_one_escaped_line_in_both_checks() -> None:
    """Before: the holder's text went into the verdict as it came (a newline and an ESC split and coloured the
    failure line, 300 x's made it wrap). Now both the rendezvous port check and the router's show one line."""
    answer = {"ok": False, "error": "Address already in use", "errno": 98, "holder": HOSTILE}
    node = SimpleNamespace(ip="127.0.0.1", host="h0")
    (head,) = rendezvous.port_check(AnswerFleet(answer), {0: node}, 29500, [0])  # type: ignore[arg-type]
    assert head.status == "fail" and head.detail.startswith("cannot listen on 127.0.0.1:29500: Address already in "
                                                            "use, held by pid 4242 (python3 -c import socket\\n"), head
    _one_line_cut(head.detail)
    assert "\\r\\x1b[31mred\\x00\\t" in head.detail, head.detail
    job = SimpleNamespace(host="h0")
    routed = router_check._ports(job, AnswerFleet(answer), "127.0.0.1", (30000, 30001))  # type: ignore[arg-type]
    assert routed.status == "fail" and len(routed.problems) == 2, routed
    for problem in routed.problems:
        assert ", held by pid 4242 (python3 -c import socket\\nsocket.socket().listen()\\r" in problem, problem
        _one_line_cut(problem)


@pytest.mark.parametrize(("text", "limit", "shown"), [
    ("python3 -m http.server", 120, "python3 -m http.server"),  # a plain one is kept as it is
    ("a\nb\tc\x7fd\u2028e", 120, "a\\nb\\tc\\x7fd\\u2028e"),  # every control or separator escaped
    ("abcdef", 6, "abcdef"),  # exactly the limit: no cut
    ("abcdefg", 6, "abcde\u2026"),
    ("ab\ncdef", 4, "ab\u2026"),  # an escape is never cut in half
    ("n\u00e9ud \u00e0 r\u00e9seau", 120, "n\u00e9ud \u00e0 r\u00e9seau"),  # printable non-ASCII stays
])
def test_one_line_escapes_and_cuts(text: str, limit: int, shown: str) -> None:
    assert port_probe.one_line(text, limit) == shown
    assert len(port_probe.one_line(text, limit)) <= limit


@pytest.fixture()
def squatter() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """A real process holding a loopback port whose argv has a newline (its program) and an ESC (an argument)."""
    proc = subprocess.Popen([sys.executable, "-c", SQUATTER, "\x1b[31mred", "y" * 400], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.timeout(60)
def test_the_probe_names_a_real_holder_on_one_line(squatter: tuple[int, subprocess.Popen[str]]) -> None:
    port, proc = squatter
    got = port_probe.holder(port)
    assert got is not None and got.startswith(f"pid {proc.pid} ({sys.executable} -c import socket, sys, time\\ns ="), got
    _one_line_cut(got)
    assert len(got) <= port_probe.HOLDER_CHARS + 20, got


@pytest.mark.timeout(120)
def test_preflight_port_line_names_a_hostile_holder_on_one_line(squatter: tuple[int, subprocess.Popen[str]],
                                                                 tmp_path: Path) -> None:
    """`k3deploy preflight` with launch.port held by that process: the port check's failure is one line (its
    text up to the fix), the holder named with its pid and its command line escaped."""
    port, proc = squatter
    topo = fake_topology(tmp_path, "pf-holder", nodes=1, launch={"port": port})
    run = cli("preflight", str(topo), "--json")
    assert run.returncode == 1 and "Traceback" not in run.stderr, (run.stdout, run.stderr)
    (check,) = [c for c in json.loads(run.stdout)["checks"] if c["name"] == "port"]
    (v,) = check["verdicts"]
    assert v["status"] == "fail" and f"cannot listen on 127.0.0.1:{port}: Address already in use, held by " \
        f"pid {proc.pid} (" in v["detail"], v
    _one_line_cut(v["detail"])
    table = cli("preflight", str(topo))
    (line,) = [ln for ln in table.stdout.splitlines() if f"held by pid {proc.pid}" in ln]
    assert table.returncode == 1 and line.startswith("port: rank 0 (localhost): cannot listen on "), table.stdout
    assert "-c import socket, sys, time\\ns = socket.socket()\\ns.bind(" in line and line.endswith("\u2026)"), line
    assert "\x1b" not in table.stdout and "\nprint(s.getsockname" not in table.stdout, table.stdout
    assert table.stdout.splitlines()[table.stdout.splitlines().index(line) + 1].startswith("  fix: stop what holds "
                                                                                         f"port {port}"), table.stdout
