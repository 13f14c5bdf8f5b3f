"""Charts as inline SVG, drawn with matplotlib (the `report` extra): text stays text (the labels are in the page,
selectable and read by screen readers), each chart carries its <title> and <desc>, and nothing refers outside it."""
from __future__ import annotations

import hashlib
import io
import re
from typing import TYPE_CHECKING, Any

from k3deploy.html_report.page import esc

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Colour-blind-safe (Okabe-Ito) and distinct in greyscale print by lightness.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999", "#000000")
_RC: dict[Any, Any] = {"svg.fonttype": "none", "svg.hashsalt": "k3deploy", "font.size": 9.0,
       "font.family": "sans-serif", "font.sans-serif": ["DejaVu Sans"], "axes.spines.top": False, "axes.spines.right": False}


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure of its own (no pyplot, no global backend): safe to draw in any process."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def svg(fig: Figure, title: str, desc: str) -> str:
    """The figure as an inline <svg> element with its title and description first (its text alternative)."""
    import matplotlib

    out = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    text = out.getvalue()
    start = text.index("<svg")
    # The RDF metadata block names remote vocabularies (never fetched, but no page of ours names any URL).
    body = re.sub(r"<metadata>.*?</metadata>\s*", "", text[start:], flags=re.DOTALL)
    # The standalone file's DOCTYPE and XML header go; the root gains the accessible name and description.
    digest = hashlib.sha1(f"{title}\n{desc}".encode()).hexdigest()[:8]
    slug = (re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:32] or "chart") + f"-{digest}"
    head_end = body.index(">") + 1
    root = body[:head_end]
    root = root.replace("<svg ", f'<svg role="img" aria-labelledby="{slug}-t {slug}-d" ', 1)
    alt = f'<title id="{slug}-t">{esc(title)}</title><desc id="{slug}-d">{esc(desc)}</desc>'
    return root + alt + body[head_end:]


def rc() -> Any:
    """The style every chart is drawn in (text as text, fixed ids)."""
    import matplotlib

    return matplotlib.rc_context(_RC)
