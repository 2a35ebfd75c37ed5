"""lens.store.checksum.crc32 is zlib's CRC-32, value for value (the store's recorded checksums)."""

from __future__ import annotations

import zlib

import numpy as np

from lens.store.checksum import crc32


def test_crc32_equals_zlib_on_buffers_of_every_kind_and_running_values():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 64, 1000, 1 << 16, (1 << 20) + 3):
        a = rng.integers(0, 256, n, dtype=np.uint8)
        for start in (0, 1, 0xFFFFFFFF, 0x12345678):
            assert crc32(a, start) == zlib.crc32(a, start)
        assert crc32(a.tobytes()) == zlib.crc32(a.tobytes()) == crc32(memoryview(a))
    x = rng.standard_normal((300, 17)).astype(np.float32)  # a layer block, in two pieces as the writer adds rows
    assert crc32(x[150:].reshape(-1).view(np.uint8), crc32(x[:150].reshape(-1).view(np.uint8))) == zlib.crc32(x)
