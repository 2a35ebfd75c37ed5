"""The store's CRC-32 (zlib's polynomial, the value ``zlib.crc32`` gives), computed at memory speed.

Every byte a capture, merge, import or export writes or reads is checksummed, so the CRC's speed is the
store's: zlib's table-driven CRC-32 runs at ~0.9 GB/s here, ISA-L's (``isal``, carry-less multiply and
AVX-512 where the CPU has them) at ~8 GB/s, and both give the same value for the same bytes
(tests/lens/store/test_checksum.py). Without ``isal`` (a platform it has no wheel for) zlib's is used.
"""

from __future__ import annotations

import zlib

try:  # optional at run time: same values, only slower without it
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel falls back
    _fast_crc32 = None


def crc32(data, value: int = 0) -> int:
    """``zlib.crc32(data, value)``: ``data`` any buffer (bytes, a memoryview, a C-contiguous numpy array)."""
    if _fast_crc32 is None:
        return zlib.crc32(data, value)
    return _fast_crc32(data, value)


FAST = _fast_crc32 is not None

__all__ = ["crc32", "FAST"]
