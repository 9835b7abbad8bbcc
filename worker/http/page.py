"""The page at `/` (`page.html`) with the server's limits filled in, and the icon browsers ask for at
`/favicon.ico`.

The page checks each line against `max_text_chars` itself, so one over-long line gets its own error row
(as the Kafka path dead-letters only that message) instead of the API's 422 for the whole request, and it
sends the other lines in requests of at most `http_max_texts` texts and `http_max_body_bytes` bytes.
"""

from __future__ import annotations

import struct
import zlib
from functools import cache
from importlib import resources

from worker.config import HttpSettings, LimitsSettings

FAVICON_MEDIA_TYPE = "image/vnd.microsoft.icon"
FOLD_CHARS = 200
"""Reviews longer than this are shown folded to their first FOLD_CHARS characters, with a button to
expand them."""

_PAGE = resources.files("worker.http").joinpath("page.html")
_ICON_SIZE = 16
_ICON_RGBA = (0x4B, 0x6C, 0xD6, 0xFF)  # the confidence bar's blue


def render_page(http: HttpSettings, limits: LimitsSettings) -> str:
    """page.html with the limits the API enforces (it reads them from `<body data-...>`)."""
    values = {
        "__MAX_TEXT_CHARS__": limits.max_text_chars,
        "__MAX_TEXTS__": http.http_max_texts,
        "__MAX_BODY_BYTES__": http.http_max_body_bytes,
        "__FOLD_CHARS__": FOLD_CHARS,
    }
    html = _PAGE.read_text(encoding="utf-8")
    for placeholder, value in values.items():
        html = html.replace(placeholder, str(value))
    return html


@cache
def favicon_ico() -> bytes:
    """A 16 x 16 ICO file (one PNG image, as every current browser reads it): a blue disc."""
    png = _disc_png(_ICON_SIZE)
    header = struct.pack("<HHH", 0, 1, 1)  # reserved, type 1 = icon, one image
    entry = struct.pack("<BBBBHHII", _ICON_SIZE, _ICON_SIZE, 0, 0, 1, 32, len(png), 6 + 16)
    return header + entry + png


def _disc_png(size: int) -> bytes:
    centre, radius2 = (size - 1) / 2, (size / 2 - 0.5) ** 2
    transparent = bytes(4)
    rows = b"".join(
        b"\x00"  # filter type 0 per scanline
        + b"".join(
            bytes(_ICON_RGBA) if (x - centre) ** 2 + (y - centre) ** 2 <= radius2 else transparent
            for x in range(size)
        )
        for y in range(size)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)  # 8-bit RGBA
    signature = b"\x89PNG\r\n\x1a\n"
    return signature + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
