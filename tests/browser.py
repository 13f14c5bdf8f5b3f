"""A page as a person sees it: headless Chromium opens a local HTML file, screenshots it and dumps the DOM it
built, with a net log of every request it tried (Debian's chromium-headless-shell; scripts/test.sh installs it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS_ENV = "K3_UPDATE_SCREENSHOTS"  # set: the tests that show a view write its picture under docs/screenshots
# The headless shell first (its own package, no display needed); a full Chromium runs headless as well.
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")
REMOTE = ("http://", "https://", "ws://", "wss://", "ftp://")


def browser() -> str | None:
    """The Chromium on PATH, if any."""
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


NO_BROWSER = ("needs headless Chromium (apt-get install chromium-headless-shell; scripts/test.sh installs it), "
              "which this machine lacks")


@dataclass(frozen=True)
class Shot:
    """What the browser made of a page."""

    dom: str  # the document as the browser built it (--dump-dom)
    png: Path  # the screenshot
    requests: list[str]  # every URL the net log saw requested


def open_page(page: Path, png: Path, width: int = 1000, height: int = 1400, timeout_s: float = 60) -> Shot:
    """Open `page` (a local file) in headless Chromium: screenshot it to `png`, dump its DOM, log its requests."""
    exe = browser()
    assert exe is not None, NO_BROWSER
    with tempfile.TemporaryDirectory(prefix="k3-chromium-") as tmp:
        netlog = Path(tmp) / "net.json"
        argv = [exe, *([] if exe.endswith("headless-shell") else ["--headless=new"]),
                "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}", "--force-device-scale-factor=1",
                f"--log-net-log={netlog}", f"--screenshot={png}", "--dump-dom", page.resolve().as_uri()]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env={**os.environ, "HOME": tmp})
        assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
        return Shot(done.stdout, png, requested_urls(netlog))


def requested_urls(netlog: Path) -> list[str]:
    """Every URL a Chromium net log names in an event's parameters."""
    doc = json.loads(netlog.read_text())
    urls = []
    for event in doc.get("events", []):
        params = event.get("params") or {}
        for key in ("url", "original_url", "new_location"):
            value = params.get(key)
            if isinstance(value, str):
                urls.append(value)
    return urls


def remote(urls: list[str]) -> list[str]:
    """The URLs that would leave the machine (network schemes)."""
    return sorted({u for u in urls if u.lower().startswith(REMOTE)})


def colour_pixels(png: Path, rgb: tuple[int, int, int], tolerance: int = 24) -> int:
    """How many pixels of the screenshot are within `tolerance` of a colour (per channel)."""
    from PIL import Image

    with Image.open(png) as img:
        rgb_img = img.convert("RGB")
        pixels = rgb_img.get_flattened_data() if hasattr(rgb_img, "get_flattened_data") else rgb_img.getdata()
        r0, g0, b0 = rgb
        return sum(1 for r, g, b in pixels if abs(r - r0) <= tolerance and abs(g - g0) <= tolerance
                   and abs(b - b0) <= tolerance)


def hex_rgb(colour: str) -> tuple[int, int, int]:
    """#RRGGBB as a tuple."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def keep_screenshot(shot: Shot, name: str) -> None:
    """With K3_UPDATE_SCREENSHOTS set, the README's picture: docs/screenshots/NAME, reduced to a palette (small)."""
    if not os.environ.get(SCREENSHOTS_ENV):
        return
    from PIL import Image

    with Image.open(shot.png) as img:
        small = img.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        small.save(ROOT / "docs/screenshots" / name, optimize=True)


class _Texts(HTMLParser):
    """The text of every SVG <text>, <title> and <desc> element, and of the page outside them."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.chart: list[str] = []
        self.alt: list[str] = []
        self.page: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if "svg" in self.stack and self.stack[-1] == "text":
            self.chart.append(data)
        elif "svg" in self.stack and self.stack[-1] in ("title", "desc"):
            self.alt.append(data)
        elif data.strip() and not {"style", "script"} & set(self.stack):
            self.page.append(data)


@dataclass(frozen=True)
class Texts:
    """A dumped DOM's text: inside the charts (their labels), their text alternatives, and the rest."""

    chart: list[str]
    alt: list[str]
    page: str


def texts(dom: str) -> Texts:
    """Read a dumped DOM's text."""
    parser = _Texts()
    parser.feed(dom)
    return Texts(parser.chart, parser.alt, " ".join(" ".join(parser.page).split()))
