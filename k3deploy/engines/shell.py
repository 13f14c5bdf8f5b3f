"""The one place a LaunchSpec becomes shell text: exports, secrets resolved on the node, exec argv."""
from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from k3deploy.engines.redact import secret_env
from k3deploy.engines.spec import LaunchSpec

# Templated exports (LWS) mark a shell expansion inside a word with these private-use characters;
# only `quote(..., template=True)` turns them into "${VAR}", so topology text can never do so.
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARKED = re.compile(f"{_OPEN}([A-Za-z_][A-Za-z0-9_]*){_CLOSE}")


def expansion(var: str) -> str:
    """A word part that templated exports render as "${VAR}"."""
    return f"{_OPEN}{var}{_CLOSE}"


def has_marker(text: str) -> bool:
    """True if text carries expansion markers (topology strings must not)."""
    return _OPEN in text or _CLOSE in text


def quote(word: str, *, template: bool = False) -> str:
    """One argv word for POSIX sh, arriving verbatim; with template, markers become "${VAR}"."""
    if not template or not has_marker(word):
        return shlex.quote(word)
    parts = _MARKED.split(word)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f'"${{{part}}}"')
        elif has_marker(part):
            raise ValueError(f"unbalanced expansion marker in {word!r}")
        elif part:
            out.append(shlex.quote(part))
    return "".join(out)


def printed(argv: Iterable[str]) -> str:
    """argv as the inside of one double-quoted sh word: printed, it is the command quoted word by word, with each
    marked expansion replaced by its value (for values that need no quoting: addresses)."""
    words = []
    for word in argv:
        out = []
        for i, part in enumerate(_MARKED.split(word)):
            if i % 2:
                out.append(f"${{{part}}}")
            elif has_marker(part):
                raise ValueError(f"unbalanced expansion marker in {word!r}")
            elif part:
                out.append(re.sub(r'([\\"$`])', r"\\\1", shlex.quote(part)))
        words.append("".join(out) or "''")
    return " ".join(words)


def command_text(argv: Iterable[str], *, template: bool = False, indent: str = "  ") -> str:
    """argv quoted word by word; after the first absolute path each flag starts a continuation line."""
    lines: list[str] = []
    seen_path = False
    for raw in argv:
        w = quote(raw, template=template)
        if lines and seen_path and raw.startswith("-"):
            lines.append(w)
        elif lines:
            lines[-1] += " " + w
        else:
            lines.append(w)
        seen_path = seen_path or raw.startswith("/")
    return (" \\\n" + indent).join(lines)


def secret_lines(secret_env_refs: dict[str, str]) -> list[str]:
    """Secrets resolved on the node at run time; the script holds only where to find them."""
    out = []
    for name, ref in secret_env_refs.items():
        kind, _, src = ref.partition(":")
        if kind == "env" and src == name:
            out.append(f'if [ -n "${{{src}+x}}" ]; then export {name}; fi')
        elif kind == "env":  # passed on only when the node has it, as `docker run -e NAME` does
            out.append(f'if [ -n "${{{src}+x}}" ]; then {name}="${{{src}}}"; export {name}; fi')
        else:
            out += [f"{name}=\"$(cat {shlex.quote(src)})\"", f"export {name}"]
    return out


def node_lines(spec: LaunchSpec, *, redact: bool = False, template: bool = False,
               secrets: bool = True) -> list[str]:
    """Exports, secrets (unless the platform injects them) and `exec argv`, one shell line each."""
    lines: list[str] = []
    for k, v in spec.env.items():
        if redact and secret_env(k, v):
            ask = f"${{{k}:?is secret-looking and not written here: set it on the node}}"
            lines += [f'{k}="{ask}"', f"export {k}"]
        else:
            lines.append(f"export {k}={quote(v, template=template)}")
    if secrets:
        lines += secret_lines(spec.secret_env)
    lines.append("exec " + command_text(spec.argv, template=template, indent="    "))
    return lines


def node_shell(spec: LaunchSpec, *, redact: bool = False, template: bool = False) -> str:
    """`set -eu`, exports, secrets, `exec argv`: what a remote shell (or a script) runs on one node."""
    # With redact, a secret-looking plain env value is not written: the node's own environment must
    # provide it (the plan warned to move it to engine.secrets).
    return "\n".join(["set -eu", *node_lines(spec, redact=redact, template=template)])
