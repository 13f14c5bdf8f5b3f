"""One self-contained HTML page: inline styles (screen and print), a Content-Security-Policy that forbids every
remote load, escaped text, tables, and the atomic write of the file."""
from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from k3deploy.errors import InputError

# Nothing may load from anywhere: inline styles and inline SVG only (images as data: URIs at most).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

STYLE = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1a1a1a;
       max-width: 1100px; margin: 1.5em auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-top: 1.2em; }
.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: .6em 0 1em; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding-bottom: .3em; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .7em .25em 0; vertical-align: top; text-align: left; }
td.n, th.n { text-align: right; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
figcaption { color: #444; font-size: .92em; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: .5em .7em; border-radius: 4px; font-size: .9em; }
.pass { color: #11751f; font-weight: 700; } .fail, .error { color: #b3121f; font-weight: 700; }
.skip { color: #8a6100; font-weight: 700; } .neg { color: #b3121f; }
.stage { break-inside: avoid; page-break-inside: avoid; }
footer { margin-top: 2em; color: #666; font-size: .85em; }
@media print {
  body { max-width: none; margin: 0; font-size: 10.5pt; }
  h2 { break-after: avoid; page-break-after: avoid; }
  figure, table, .stage { break-inside: avoid; page-break-inside: avoid; }
  pre { background: none; border: 1px solid #bbb; }
  a { color: inherit; text-decoration: none; }
}
"""


def esc(text: object) -> str:
    """Text as HTML (quotes included)."""
    return html.escape(str(text), quote=True)


def table(caption: str, headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[int] = (),
          cls: str = "") -> str:
    """A captioned table; the columns at `numeric` right-aligned. Cells are escaped text."""
    right = ' class="n"'

    def cell(tag: str, i: int, value: object) -> str:
        return f"<{tag}{right if i in numeric else ''}>{esc(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    named = f' class="{esc(cls)}"' if cls else ""
    return (f"<table{named}><caption>{esc(caption)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def figure(svg: str, caption: str) -> str:
    """A chart and the sentence under it."""
    return f"<figure>{svg}<figcaption>{esc(caption)}</figcaption></figure>"


def document(title: str, subtitle: str, body: str) -> str:
    """The whole page."""
    from k3deploy import __version__

    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body>"
            f"<h1>{esc(title)}</h1><p class=\"sub\">{esc(subtitle)}</p>\n{body}\n"
            f"<footer>k3deploy {esc(__version__)}: one self-contained file, it loads nothing from anywhere."
            f"</footer></body></html>\n")


def write_page(path: Path, text: str) -> None:
    """Write the page atomically (a temporary file beside it, then a rename): a reader never sees half a page."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"--html {path}: cannot write there ({exc.strerror or exc})",
                         hint="name a file in a folder that exists and you can write to") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"--html {path}: cannot write there ({exc.strerror or exc})",
                         hint="name a file in a folder that exists and you can write to") from None
