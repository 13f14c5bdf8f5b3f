"""A test image without an image library: an RGB PNG (zlib and struct only) of a given size, a checkerboard of
28-pixel squares (one merged token each under K3's patch 14 and 2 x 2 merge), as a data URL or served over HTTP
on this machine's loopback."""
from __future__ import annotations

import base64
import struct
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SQUARE_PX = 28
DARK, LIGHT = b"\x20\x40\x80", b"\xf0\xe8\xd0"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of width x height pixels (ValueError for a side below 1)."""
    if width < 1 or height < 1:
        raise ValueError(f"an image of {width}x{height} px has no pixels")
    rows = []
    for y in range(height):
        # filter type 0 (none) per row, then the row's pixels
        rows.append(b"\x00" + b"".join(DARK if (x // SQUARE_PX + y // SQUARE_PX) % 2 else LIGHT
                                        for x in range(width)))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour, no interlace
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"".join(rows), 6))
            + _chunk(b"IEND", b""))


def png_data_url(width: int, height: int) -> str:
    """The PNG as a data URL, as an OpenAI image_url part carries it."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(width, height)).decode()


@contextmanager
def served_png(width: int, height: int, host: str = "127.0.0.1") -> Iterator[str]:
    """The PNG at an http URL on `host` (a free port) while the block runs."""
    data = png_bytes(width, height)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="k3deploy-png", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/k3deploy-{width}x{height}.png"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
