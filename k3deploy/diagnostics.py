"""Issues: one problem with a stable code, a severity, a message and where it is in the file."""
from __future__ import annotations

from typing import Any, Literal, NamedTuple

Severity = Literal["error", "warning", "info"]


# Records that k3deploy computes (never parsed from user input) are NamedTuples rather than pydantic
# models or dataclasses: creating those classes is a measurable part of `k3deploy plan` start-up.
class Issue(NamedTuple):
    """A problem found in a topology, as reported by `plan` (JSON field names are a stable contract)."""

    code: str
    severity: Severity
    message: str
    path: str = ""
    line: int | None = None
    column: int | None = None
    hint: str | None = None

    def location(self, file: str) -> str:
        """`file:line:col` (or just `file`)."""
        if self.line is None:
            return file
        return f"{file}:{self.line}:{self.column or 1}"

    def render(self, file: str) -> str:
        """One line: `file:line:col: path: message (hint)`."""
        where = self.location(file)
        path = f"{self.path}: " if self.path else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}: {path}{self.message}{hint}"

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value, in declaration order (the `plan --json` issue object)."""
        return self._asdict()


def fmt_gib(n_bytes: float) -> str:
    """Bytes -> '45.43 GiB' (the unit of every memory figure in a message)."""
    return f"{n_bytes / (1 << 30):.2f} GiB"


def dotted(path: tuple[str | int, ...]) -> str:
    """('nodes', 1, 'ip') -> 'nodes[1].ip'."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out
