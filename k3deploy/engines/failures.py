"""What a failed start's log means: the failure signatures (engines/data/failures.yaml) matched against log lines."""
from __future__ import annotations

import functools
import re
import signal
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from k3deploy.engines.flag_tables import DATA_DIR

FAILURES_FILE = DATA_DIR / "failures.yaml"
# torch prints a C++ stack with each *retried* store connection warning ("TCP client failed to connect ...
# retrying"): its frames name DistNetworkError while the rendezvous still goes on, so a frame never names a cause.
STACK_FRAME_RE = re.compile(r"^\s*frame #\d+: ")
_FIELDS = frozenset({"id", "category", "engines", "versions", "patterns", "after", "cause", "fix", "source", "example",
                     "example_context", "fatal", "consequence"})


@dataclass(frozen=True)
class Signature:
    """One known failure: the lines it matches, its cause and fix (templates), and where the text comes from."""

    id: str
    category: str
    engines: tuple[str, ...]
    versions: str
    patterns: tuple[re.Pattern[str], ...]
    after: re.Pattern[str] | None  # holds only once an earlier line matched this
    cause: str
    fix: str
    source: str
    example: str
    example_context: tuple[str, ...]
    fatal: bool  # an engine can hang after this line: a launch stops as soon as it is seen
    consequence: bool  # the line reports another process's failure: a root cause in the same log wins

    def search(self, line: str) -> re.Match[str] | None:
        """The first of this signature's patterns that matches the line."""
        return next((m for p in self.patterns if (m := p.search(line)) is not None), None)


@dataclass(frozen=True)
class Finding:
    """A signature matched in one log: every line number (1-based) it matched, the first line, the filled texts."""

    signature: Signature
    line_numbers: tuple[int, ...]
    line: str
    cause: str
    fix: str

    def summary(self) -> str:
        """The cause and fix in one line, for a failure message."""
        return f"{self.cause} Fix: {self.fix} [{self.signature.id}]"

    def as_dict(self) -> dict[str, object]:
        """The JSON form `k3deploy explain --json` prints."""
        s = self.signature
        return {"id": s.id, "category": s.category, "lines": list(self.line_numbers), "line": self.line,
                "cause": self.cause, "fix": self.fix, "source": s.source, "engines": list(s.engines),
                "versions": s.versions}


class CatalogError(ValueError):
    """failures.yaml does not describe valid signatures (a packaging bug, caught by the unit tests)."""


@functools.lru_cache(maxsize=1)
def signatures() -> tuple[Signature, ...]:
    """The catalog, in match order (specific signatures before the general ones they overlap)."""
    import yaml

    doc = yaml.safe_load(FAILURES_FILE.read_text(encoding="utf-8"))
    out: list[Signature] = []
    for raw in doc["signatures"]:
        unknown = set(raw) - _FIELDS
        if unknown:
            raise CatalogError(f"{FAILURES_FILE.name}: {raw.get('id')}: unknown field(s) {sorted(unknown)}")
        out.append(Signature(
            id=raw["id"], category=raw["category"], engines=tuple(raw["engines"]), versions=str(raw["versions"]),
            patterns=tuple(re.compile(p) for p in raw["patterns"]),
            after=re.compile(raw["after"]) if raw.get("after") else None, cause=raw["cause"], fix=raw["fix"],
            source=raw["source"], example=raw["example"], example_context=tuple(raw.get("example_context") or ()),
            fatal=bool(raw["fatal"]), consequence=bool(raw.get("consequence", False))))
    ids = [s.id for s in out]
    if len(set(ids)) != len(ids):
        raise CatalogError(f"{FAILURES_FILE.name}: duplicate ids")
    return tuple(out)


def name_line(line: str, seen_before: Iterable[str] = ()) -> tuple[Signature, re.Match[str]] | None:
    """The first signature that matches one line (given the lines before it, for `after` signatures)."""
    return _first(line.strip(), _armed(seen_before), fatal_only=False)


def explain(log_text: str, facts: Mapping[str, str] | None = None, fatal_only: bool = False) -> list[Finding]:
    """Every signature matched in a log, in the order first seen; `facts` (host, ip, iface, rank of the node)
    fill the fixes' templates beside the values the matched line gives."""
    hits: dict[str, tuple[Signature, re.Match[str], list[int]]] = {}
    armed: set[str] = set()  # ids of `after` signatures whose earlier line has been seen
    for no, raw in enumerate(log_text.splitlines(), start=1):
        line = raw.strip()
        found = _first(line, armed, fatal_only)
        if found is not None:
            sig, m = found
            if sig.id in hits:
                hits[sig.id][2].append(no)
            else:
                hits[sig.id] = (sig, m, [no])
        armed |= _armed((line,))
    return [_finding(sig, m, nos, facts or {}) for sig, m, nos in hits.values()]


def _armed(lines: Iterable[str]) -> set[str]:
    """The `after` signatures these lines make possible."""
    text = tuple(lines)
    return {s.id for s in signatures() if s.after is not None and any(s.after.search(t) for t in text)}


def _first(line: str, armed: set[str], fatal_only: bool) -> tuple[Signature, re.Match[str]] | None:
    if STACK_FRAME_RE.match(line):
        return None
    for sig in signatures():
        if (fatal_only and not sig.fatal) or (sig.after is not None and sig.id not in armed):
            continue
        m = sig.search(line)
        if m is not None:
            return sig, m
    return None


def root_cause(log_text: str, facts: Mapping[str, str] | None = None) -> Finding | None:
    """The finding that explains a failed node: the earliest that is not another process's failure, else the
    earliest (vLLM's worker raises before its executor reports the worker dead)."""
    found = sorted(explain(log_text, facts), key=lambda f: (f.signature.consequence, f.line_numbers[0]))
    return found[0] if found else None


def first_fatal(log_text: str) -> Finding | None:
    """The first line naming a failure an engine can hang after (these stop a launch at once)."""
    found = explain(log_text, fatal_only=True)
    return min(found, key=lambda f: f.line_numbers[0]) if found else None


def _finding(sig: Signature, m: re.Match[str], line_numbers: list[int], facts: Mapping[str, str]) -> Finding:
    values = {**facts, **{k: v for k, v in m.groupdict().items() if v is not None}}
    values.update(_derived(values))
    return Finding(signature=sig, line_numbers=tuple(line_numbers), line=m.string,
                   cause=fill(sig.cause, values), fix=fill(sig.fix, values))


def _derived(values: Mapping[str, str]) -> dict[str, str]:
    """Values a fix names that the matched line implies: the sizes that divide a count, a signal's name."""
    out: dict[str, str] = {}
    for count, key in (("heads", "tp_choices"), ("experts", "ep_choices")):
        if values.get(count, "").isdigit():
            n = int(values[count])
            out[key] = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
    code = values.get("exit_code", "")
    if code.startswith("-") and code[1:].isdigit():
        try:
            out["signal"] = signal.Signals(int(code[1:])).name
        except ValueError:
            out["signal"] = code[1:]
    return out


def fill(template: str, values: Mapping[str, str]) -> str:
    """A cause or fix with its {name} fields filled; a field without a value reads <name>."""
    parts = []
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        parts.append(literal)
        if name is not None:
            parts.append(values.get(name) or f"<{name}>")
    return "".join(parts)
