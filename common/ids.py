"""Opaque, time-ordered public identifiers such as ``pay_01JD3...``.

The 26 characters after the prefix are a ULID (48-bit millisecond time, 80 random
bits, Crockford base32): sortable, so new rows append to the primary-key index
instead of splitting random pages, and unguessable enough that an id proves nothing.
"""

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(prefix: str) -> str:
    """Return ``<prefix>_<ULID>``."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"
