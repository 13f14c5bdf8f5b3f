"""The suite's reliability figures: tests add to them, tests/conftest.py prints them once at the end."""
from __future__ import annotations

from collections import Counter

INPUTS_FUZZED = "inputs fuzzed"
FAULTS_INJECTED = "faults injected"
NODES_LEFT = "nodes left running"
SECRETS_LEAKED = "secrets leaked"
TRACEBACKS = "tracebacks seen"
NAMES = (INPUTS_FUZZED, FAULTS_INJECTED, NODES_LEFT, SECRETS_LEAKED, TRACEBACKS)

FIGURES: Counter[str] = Counter()


def add(name: str, n: int = 1) -> None:
    """Count `n` more of one figure (one of NAMES)."""
    assert name in NAMES, name
    FIGURES[name] += n


def fault_injected() -> None:
    """One more fault injected into a deployment or an engine (a kill, a cut link or sshd, a signal...)."""
    add(FAULTS_INJECTED)


def summary_lines() -> list[str]:
    """One line per figure, in a fixed order, zeros included (a zero is a result too)."""
    return [f"{name:<20} {FIGURES[name]:>8,}" for name in NAMES]
