"""Issues: one problem with a stable code, a severity, a message and where it is in the file."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Severity = Literal["error", "warning", "info"]


class Issue(BaseModel):
    """A problem found in a topology, as reported by `plan` (JSON field names are a stable contract)."""

    model_config = ConfigDict(frozen=True)

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


def dotted(path: tuple[str | int, ...]) -> str:
    """('nodes', 1, 'ip') -> 'nodes[1].ip'."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out
