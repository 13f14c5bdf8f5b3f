"""Rich's SIMPLE_HEAD tables (pad_edge off, text cells) laid out as rich lays them out, for plain output.

Why: `plan --workload` prints five such tables on every run, and rich's general layout of them (measure,
wrap, segments, cropping) was the whole gap between `plan --workload` and the plan speed bar
(bench/plan_startup.py: 1.27x the typer floor against 1.25x), for a prediction that costs 0.6 ms. This module
repeats rich 15's arithmetic (`Table._calculate_column_widths`, `_collapse_widths`, `ratio_reduce`,
`Padding` and `Text` measure, `divide_line`, `Text.wrap` with left/right justify and ellipsis/fold overflow)
for exactly that subset. Measured in process (warm, gc off, 80 columns, load 0.4): the prediction drawn in
0.9 ms against 8.7 ms by rich; `plan`'s memory budget in 0.26 ms against 3.4 ms.
Anything outside the subset falls back to rich itself, table by table: a console that writes styles
(a terminal), records or is not UTF-8, text that is not printable ASCII or that the console would read as
markup or emoji, a column narrower than its padding. tests/unit/test_plain_table.py holds the two renderings
byte-identical for random tables at 20..220 columns and for every shipped topology's plan and prediction.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions

Justify = Literal["left", "right"]


class Styled(NamedTuple):
    """A cell rich shows in a style (a rich Text); plain output shows its text only."""

    text: str
    style: str


Cell = str | Styled
_WORD = re.compile(r"\s*\S+\s*")  # rich._wrap.re_word: a word with the spaces around it
_TRAILING = re.compile(r"\s+$")


@dataclass(frozen=True)
class SimpleTable:
    """A left-titled SIMPLE_HEAD table of text cells (lines split at "\\n"): rich draws `rich_table`, this
    module draws the same lines when the output is plain."""

    title: str
    columns: tuple[tuple[str, Justify], ...]
    rows: tuple[tuple[Cell, ...], ...]

    def rich_table(self) -> Any:
        """The rich Table this stands for (the fallback, and the reference the tests hold the lines to)."""
        from rich import box
        from rich.table import Table
        from rich.text import Text

        t = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for header, justify in self.columns:
            t.add_column(header, justify=justify)
        for row in self.rows:
            t.add_row(*(Text(c.text, style=c.style) if isinstance(c, Styled) else c for c in row))
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        plain = (console.color_system is None and not console.record and not options.legacy_windows
                 and not options.ascii_only and options.justify is None and options.overflow is None
                 and not options.no_wrap)
        lines = self.plain_lines(options.max_width) if plain and _plain_text(console, self) else None
        if lines is None:
            yield self.rich_table()
        else:
            from rich.segment import Segment

            yield Segment("\n".join(lines) + "\n")

    def texts(self) -> Iterator[str]:
        """Every string the table shows."""
        yield self.title
        for header, _ in self.columns:
            yield header
        for row in self.rows:
            yield from (c.text if isinstance(c, Styled) else c for c in row)

    def plain_lines(self, max_width: int) -> list[str] | None:
        """The lines rich draws at `max_width` columns, or None where this layout does not hold."""
        n = len(self.columns)
        if not n or any(len(r) != n for r in self.rows):
            return None
        pads = [((0 if i == 0 else 1), (0 if i == n - 1 else 1)) for i in range(n)]
        cols = [[h, *(_text(r[i]) for r in self.rows)] for i, (h, _) in enumerate(self.columns)]
        extra = 2 + n - 1  # the edges and the dividers
        widths = _column_widths(cols, pads, max_width - extra)
        body: list[str] = []
        for index, cells in enumerate(zip(*cols)):
            wrapped = []
            for width, (left, right), text, (_, justify) in zip(widths, pads, cells, self.columns):
                if width - left - right < 1:
                    return None
                lines = [w for line in text.split("\n") for w in _wrap(line, width - left - right, justify, "ellipsis")]
                wrapped.append([" " * left + line + " " * right for line in lines])
            height = max(len(c) for c in wrapped)
            for width, c in zip(widths, wrapped):
                blank = [" " * width] * (height - len(c))
                c[:] = blank + c if index == 0 else c + blank  # the header sits at the bottom of its row
            body += [" " + " ".join(parts) + " " for parts in zip(*wrapped)]
            if index == 0:
                body.append(" " + "─".join("─" * w for w in widths) + " ")
        table_width = sum(widths) + extra
        edge = " " * table_width
        title = [w for line in self.title.split("\n") for w in _wrap(line, table_width, "left", "fold")]
        return [*(title if self.title else []), edge, *body, edge]


def _column_maximums(longest: list[int], pads: list[tuple[int, int]], widths: list[int]) -> list[int]:
    """Each column's measured maximum when it may take `widths[i]` cells (Table._measure_column over
    Measurement.get of Padding(Text) cells; a Text's minimum never exceeds its maximum, so the normalize
    steps change nothing, and the table uses the maximums only)."""
    out = []
    for hi, (left, right), width in zip(longest, pads, widths):
        pad = left + right
        out.append(0 if width < 1 else width if width - pad < 1 else min(hi + pad, width))
    return out


def _column_widths(cols: list[list[str]], pads: list[tuple[int, int]], max_width: int) -> list[int]:
    """Table._calculate_column_widths for flexible, wrapping columns and no expand."""
    longest = [max(len(line) for t in texts for line in t.split("\n")) for texts in cols]
    widths = [w or 1 for w in _column_maximums(longest, pads, [max_width] * len(cols))]
    if sum(widths) > max_width:
        widths = _collapse(widths, max_width)
        if sum(widths) > max_width:
            widths = _ratio_reduce(sum(widths) - max_width, [1] * len(widths), widths, widths)
        widths = _column_maximums(longest, pads, widths)
    return widths


def _collapse(widths: list[int], max_width: int) -> list[int]:
    """Table._collapse_widths with every column wrapable: shave the widest columns down in turn."""
    total = sum(widths)
    excess = total - max_width
    while total and excess > 0:
        widest = max(widths)
        second = max((w for w in widths if w != widest), default=0)
        if not widest - second:
            break
        ratios = [1 if w == widest else 0 for w in widths]
        widths = _ratio_reduce(excess, ratios, [min(excess, widest - second)] * len(widths), widths)
        total = sum(widths)
        excess = total - max_width
    return widths


def _ratio_reduce(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    """rich._ratio.ratio_reduce."""
    ratios = [r if m else 0 for r, m in zip(ratios, maximums)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return values[:]
    result = []
    for ratio, maximum, value in zip(ratios, maximums, values):
        if ratio and total_ratio > 0:
            cut = min(maximum, round(ratio * total / total_ratio))
            result.append(value - cut)
            total -= cut
            total_ratio -= ratio
        else:
            result.append(value)
    return result


def _wrap(text: str, width: int, justify: Justify, overflow: str) -> list[str]:
    """Text.wrap of one line of single-cell characters, every line `width` wide."""
    if len(text) <= width:  # most cells: one line, no break
        return [text.ljust(width) if justify == "left" else text.rstrip().rjust(width)]
    breaks = _breaks(text, width, fold=overflow == "fold")
    out = []
    for a, b in zip([0, *breaks], [*breaks, len(text)]):
        line = text[a:b]
        if len(line) > width:  # Text.rstrip_end
            m = _TRAILING.search(line)
            if m is not None:
                line = line[:len(line) - min(len(m.group(0)), len(line) - width)]
        if justify == "left":
            line = _truncate(line, width, overflow, pad=True)
        else:
            line = _truncate(line.rstrip(), width, overflow, pad=False)
            line = " " * (width - len(line)) + line
        out.append(_truncate(line, width, overflow, pad=False))
    return out


def _truncate(line: str, width: int, overflow: str, pad: bool) -> str:
    """Text.truncate for single-cell characters."""
    length = len(line)
    if length > width:
        line = line[:width - 1].ljust(width - 1) + "…" if overflow == "ellipsis" else line[:width].ljust(width)
    if pad and length < width:
        line += " " * (width - length)
    return line


def _breaks(text: str, width: int, fold: bool) -> list[int]:
    """rich._wrap.divide_line for single-cell characters: where the lines of `text` start."""
    breaks: list[int] = []
    offset = 0
    for m in _WORD.finditer(text):
        start, word = m.start(), m.group(0)
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:
            if fold:
                pieces = [word[i:i + width] for i in range(0, len(word), width)]
                for i, piece in enumerate(pieces):
                    if start:
                        breaks.append(start)
                    if i == len(pieces) - 1:
                        offset = len(piece)
                    else:
                        start += len(piece)
            else:
                if start:
                    breaks.append(start)
                offset = len(word)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return breaks


def _text(cell: Cell) -> str:
    return cell.text if isinstance(cell, Styled) else cell


def _plain_text(console: Console, table: SimpleTable) -> bool:
    """Every string is printable ASCII (and line breaks) the console shows as it is (no markup, no emoji)."""
    for s in table.texts():
        if not (s.isascii() and s.replace("\n", " ").isprintable()):
            return False
        if "[" in s or ":" in s:
            t = console.render_str(s, highlight=False)
            if t.plain != s or t.spans:
                return False
    return True
