"""Hostile inputs for k3deploy: mutated shipped topologies and catalogs (hypothesis strategies), fixed
YAML attacks, and the CLI run in-process so ten thousand of them fit in the CI budget."""
from __future__ import annotations

import copy
import io
import json
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from hypothesis import strategies as st

from k3deploy.cli import build_app
from k3deploy.cli.common import run_app

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))
SHIPPED_DOCS = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in SHIPPED]

# Values that have broken parsers and shells before: substitutions, separators, quotes, flag-like and
# control characters, byte-order marks, floats that are not numbers.
HOSTILE_STRINGS = ("$(id)", "`id`", "a; rm -rf /", "a && b", "a\nb", "'", '"', "-rf", "--help", "a\x00b",
                   "\t", "\ufeffname", "\u202etxt", "${HOME}", "~root", "*", "%s%n", "..", "/dev/zero",
                   "é" * 40, "x" * 100_000, "", " ", "null", "~", "0x10", "1e400", ".nan", "-.inf", "yes")
HUGE_NUMBERS = (2**63, -(2**63) - 1, 10**30, -1, 0, 2**31, float("inf"), float("-inf"), float("nan"), 1e308)
# Plain scalars Python itself will not read or that overflow: integers past the int-string limit (4,300 digits;
# no Python value of them can be dumped, so they travel as sentinels that dump_text swaps for the text),
# floats past float range (inf, or a string), dates that do not exist (YAML 1.1 timestamps).
PAST_LIMITS = ("9" * 5000, "-" + "1" * 4301, "+" + "7" * 4400, "1_" * 4400 + "1", "1.0e+999", "-1.0e+999", "1e999",
               "1" * 400 + ".5", "2026-13-45", "0x" + "f" * 5000)
RAW_TEXTS = (*PAST_LIMITS, "0." + "0" * 400 + "1e-99999")  # and one that underflows to 0.0, a valid number
_SENTINEL = re.compile(r"""(["']?)K3RAWNUM_(\d+)_\1""")
RAW_NUMBERS = tuple(f"K3RAWNUM_{i}_" for i in range(len(RAW_TEXTS)))


def unraw(text: str) -> str:
    """Text with each past-limit sentinel (quoted or not) replaced by the number it stands for."""
    return _SENTINEL.sub(lambda m: RAW_TEXTS[int(m.group(2))], text)


def scalars() -> st.SearchStrategy[Any]:
    """A value of any YAML scalar kind, biased to the ones that break things."""
    return st.one_of(
        st.sampled_from(HOSTILE_STRINGS), st.sampled_from(HUGE_NUMBERS), st.sampled_from(RAW_NUMBERS),
        st.integers(min_value=-(2**80), max_value=2**80), st.floats(), st.booleans(), st.none(),
        st.text(max_size=40),  # any code point but surrogates: control characters, RTL marks, emoji
    )


def values() -> st.SearchStrategy[Any]:
    """A scalar, or a small list or mapping of them (a wrong type where a scalar belongs, and back)."""
    return st.recursive(scalars(), lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=8)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a document (mapping keys and list indices), parents before children."""
    out: list[tuple[Any, ...]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out.append(prefix + (key,))
        out += paths(value, prefix + (key,))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


# Strategies built once: hypothesis validates a strategy the first time it draws from it, and a recursive
# one built per draw made generation cost more than the code under test.
VALUES = values()
INDEX = st.integers(0, 2**16)
EDITS = st.integers(1, 3)
OPS = st.sampled_from(("replace", "replace", "replace", "delete", "rename", "add"))
SHORT_TEXT = st.text(max_size=2)
KEY_TEXT = st.text(max_size=12)


@st.composite
def mutated_documents(draw: st.DrawFn, bases: list[Any]) -> Any:
    """A shipped document with one to three edits: a value replaced (wrong type, huge, hostile), a key
    removed, renamed (a typo) or added."""
    doc = copy.deepcopy(bases[draw(INDEX) % len(bases)])
    for _ in range(draw(EDITS)):
        choices = paths(doc)
        if not choices:
            break
        path = choices[draw(INDEX) % len(choices)]
        parent = _parent(doc, path)
        op = draw(OPS)
        if op == "replace":
            parent[path[-1]] = draw(VALUES)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict) and op == "rename":
            parent[str(path[-1])[:-1] + draw(SHORT_TEXT)] = parent.pop(path[-1])
        elif isinstance(parent, dict):
            parent[draw(KEY_TEXT)] = draw(VALUES)
    return doc


def _dump(doc: Any, style: str) -> str:
    if style == "json":
        return unraw(json.dumps(doc, ensure_ascii=False))
    return unraw(yaml.dump(doc, Dumper=yaml.CSafeDumper, allow_unicode=style == "unicode",
                           default_flow_style=style == "flow", width=60))


def dump_yaml(doc: Any) -> str:
    """A document as block YAML, past-limit numbers written out."""
    return _dump(doc, "unicode")


TEXT_EDITS = st.integers(0, 2)
TEXT_OPS = st.sampled_from(("bom", "tab", "dup", "char", "cut"))
CHARS = st.characters()


@st.composite
def text_edits(draw: st.DrawFn, text: str) -> str:
    """Damage at the text level, where a document model cannot go: BOMs, tabs, duplicated lines (duplicate
    keys), stray characters, truncation."""
    lines = text.split("\n")
    for _ in range(draw(TEXT_EDITS)):
        op = draw(TEXT_OPS)
        i = draw(INDEX) % len(lines)
        if op == "bom":
            lines[0] = "\ufeff" + lines[0]
        elif op == "tab":
            lines[i] = lines[i].replace("  ", "\t", 1)
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "char":
            at = draw(INDEX) % (len(lines[i]) + 1)
            lines[i] = lines[i][:at] + draw(CHARS) + lines[i][at:]
        else:
            lines = lines[: i + 1]
            lines[i] = lines[i][: draw(INDEX) % (len(lines[i]) + 1)]
    return "\n".join(lines)


STYLE_NAMES = ("block", "flow", "unicode", "json")


@st.composite
def topology_texts(draw: st.DrawFn) -> str:
    """A mutated shipped topology as YAML (block, flow or unicode) or JSON text, possibly damaged."""
    doc = draw(mutated_documents(SHIPPED_DOCS))
    return str(draw(text_edits(_dump(doc, draw(st.sampled_from(STYLE_NAMES))))))


@st.composite
def topology_text_sets(draw: st.DrawFn) -> list[str]:
    """One mutated shipped topology written every way (YAML block, flow, unicode; JSON), each damaged
    differently: four inputs for one document's generation cost."""
    doc = draw(mutated_documents(SHIPPED_DOCS))
    return [str(draw(text_edits(_dump(doc, style)))) for style in STYLE_NAMES]


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """Nested aliases: a few hundred bytes naming width**levels values."""
    lines = [f'l0: &l0 [{", ".join(["lol"] * width)}]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + f"\nname: *l{levels - 1}\n"


def attacks() -> dict[str, bytes]:
    """Fixed hostile files: alias bombs, deep nesting (flow and block), empty, binary, bad encodings."""
    demo = (ROOT / "topologies" / "local-demo.yaml").read_text(encoding="utf-8")
    deep_block = "".join(f"{'  ' * i}k{i}:\n" for i in range(5000)) + f"{'  ' * 5000}v\n"
    return {
        "billion-laughs": billion_laughs().encode(),
        "alias-bomb-in-args": (demo + "x: &x [a, a, a, a, a, a, a, a, a, a]\n"
                               + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}' if i else '*x'] * 10)}]\n"
                                         for i in range(8))).encode(),
        "deep-flow": ("name: " + "[" * 100_000 + "]" * 100_000 + "\n").encode(),
        "deep-map": ("name: " + "{a: " * 20_000 + "1" + "}" * 20_000 + "\n").encode(),
        "deep-block": deep_block.encode(),
        "empty": b"",
        "only-comment": b"# nothing\n",
        "null-document": b"~\n",
        "list-document": b"- a\n- b\n",
        "binary": bytes(range(256)) * 64,
        "utf16": demo.encode("utf-16"),
        "latin1": ("name: caf\xe9\n" + demo).encode("latin-1"),
        "bom": b"\xef\xbb\xbf" + demo.encode(),
        "nul-bytes": demo.encode().replace(b"\n", b"\x00\n", 3),
        "two-documents": (demo + "---\n" + demo).encode(),
        "tabs": demo.replace("  - ", "\t- ").encode(),
        "huge-line": b"name: " + b"x" * 5_000_000 + b"\n",
        "many-keys": ("\n".join(f"k{i}: {i}" for i in range(200_000)) + "\n").encode(),
        "python-tag": b"name: !!python/object/apply:os.system ['id']\n",
        "int-past-limit": demo.replace("tp: 4", "tp: " + "4" * 5000).encode(),
        "int-key-past-limit": (demo + "9" * 4400 + ": x\n").encode(),
        "float-past-range": demo.replace("context_length: 32768", "context_length: 1.0e+999").encode(),
        "float-past-range-in-timeout": demo.replace("dist_timeout_s: 60", "dist_timeout_s: 1.0e+999").encode(),
        "date-that-is-not": demo.replace("revision: tiny-r1", "revision: 2026-13-45").encode(),
        # found by the fuzzer on CI's newer hypothesis (6cb2ac1): a list or a mapping used as a key
        "complex-key": (demo + "? [a, b]\n: x\n").encode(),
        "mapping-key": (demo + "{a: 1}: x\n").encode(),
        "merge-keys": ("base: &b {tp: 4}\n" + demo.replace("parallel: {", "parallel: {<<: *b, ")).encode(),
    }


class CliResult(NamedTuple):
    """One in-process run of the CLI."""

    code: int
    out: str
    err: str


@cache
def _app(command: str) -> Any:
    return build_app(command)


def run_cli(*args: str | Path) -> CliResult:
    """`k3deploy ARGS` in this process, through the same entry point and error mapping as the console
    script (run_app), with stdout and stderr captured."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["k3deploy", *argv]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = run_app(_app(argv[0]))
    finally:
        sys.argv = saved
    return CliResult(code, out.getvalue(), err.getvalue())
