"""/favicon.ico: a clock face (a blue disc, white hands at three o'clock), drawn here as a
32x32 PNG inside an ICO container, so every page stops asking for a file that is not there
(a 404 per page view in the log). Built once at import from a few lines of geometry: no
image file to collect, no image library."""

import math
import struct
import zlib

from django.http import HttpResponse
from django.views.decorators.http import require_safe

SIZE = 32
BLUE = (37, 99, 235, 255)  # the dashboard's bar colour (#2563eb)
WHITE = (255, 255, 255, 255)
CLEAR = (0, 0, 0, 0)


def _near_segment(px: float, py: float, x1: float, y1: float, x2: float, y2: float, width: float) -> bool:
    dx, dy = x2 - x1, y2 - y1
    t = max(0.0, min(1.0, ((px - x1) * dx + (py - y1) * dy) / (dx * dx + dy * dy)))
    return math.hypot(px - (x1 + t * dx), py - (y1 + t * dy)) <= width / 2


def clock_pixels() -> list[list[tuple[int, int, int, int]]]:
    """Rows of RGBA pixels: a disc with an hour and a minute hand."""
    centre = (SIZE - 1) / 2
    hands = [(centre, centre - 10.0, 3.0), (centre + 7.0, centre, 3.0)]  # (tip x, tip y, width)
    rows = []
    for y in range(SIZE):
        row = []
        for x in range(SIZE):
            if math.hypot(x - centre, y - centre) > SIZE / 2 - 0.5:
                row.append(CLEAR)
            elif any(_near_segment(x, y, centre, centre, tx, ty, w) for tx, ty, w in hands):
                row.append(WHITE)
            else:
                row.append(BLUE)
        rows.append(row)
    return rows


def png_bytes(rows) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(v for pixel in row for v in pixel) for row in rows)
    header = struct.pack(">IIBBBBB", len(rows[0]), len(rows), 8, 6, 0, 0, 0)  # 8-bit RGBA
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def ico_bytes(png: bytes, size: int) -> bytes:
    """An ICO holding one PNG image (every current browser reads PNG-in-ICO)."""
    directory = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", size % 256, size % 256, 0, 0, 1, 32, len(png), 6 + 16)
    return directory + entry + png


FAVICON = ico_bytes(png_bytes(clock_pixels()), SIZE)


@require_safe
def favicon(request):
    response = HttpResponse(FAVICON, content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
