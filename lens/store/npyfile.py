"""``.npy`` files written by positioned writes and read back only after their header is checked.

Writing: :class:`BlockFile` lays out one activation file — ``(blocks, rows, width)``, one block per
layer — as a standard ``.npy`` (format 1.0 header) and fills it with ``os.pwrite``. It does not use a
memory map: a memory-mapped store on a full disk dies by SIGBUS with no message, while ``pwrite``
raises ``OSError(ENOSPC)`` that the capture turns into a clear error. The file is preallocated
(``posix_fallocate``) when it is created, so a shard that cannot fit fails before any activation is
computed for it. Each block's CRC-32 is accumulated as its rows arrive (rows come in token order).

Reading: :func:`parse_header` reads a header without trusting it; the reader compares what it says
(dtype, order, shape) with what the manifest implies before it maps a single data byte.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lens.errors import StoreCorruptError
from lens.store import fsio
from lens.store.checksum import crc32
from lens.store.faults import fault_point


def header_bytes(dtype: np.dtype, shape: tuple) -> bytes:
    """The exact header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(int(n) for n in shape)})
    return buf.getvalue()


@dataclass(frozen=True)
class NpyHeader:
    dtype: np.dtype
    shape: tuple
    fortran_order: bool
    data_offset: int  # bytes before the first data byte


def parse_header(fh, name: str) -> NpyHeader:
    """Parse the ``.npy`` header at the start of the open binary file ``fh`` (``name`` for messages)."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, SyntaxError, TypeError, EOFError, OSError, OverflowError) as exc:
        raise StoreCorruptError(f"{name}: not a readable .npy header ({exc})") from None
    return NpyHeader(np.dtype(dtype), tuple(shape), bool(fortran), fh.tell())


def parse_header_bytes(raw: bytes, name: str) -> NpyHeader:
    return parse_header(io.BytesIO(raw), name)


def _pwrite_all(fd: int, data, offset: int) -> None:
    fsio.pwrite_all(fd, data, offset)


class BlockFile:
    """A new ``.npy`` file of shape ``(blocks, rows, width)`` filled one row range at a time."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.header = header_bytes(self.dtype, self.shape)
        self.row_bytes = self.shape[2] * self.dtype.itemsize
        self.block_bytes = self.shape[1] * self.row_bytes
        self.size = len(self.header) + self.shape[0] * self.block_bytes
        self.crcs = [0] * self.shape[0]
        self.next_row = [0] * self.shape[0]
        self.fd = fsio.open_new(self.path)  # O_EXCL | O_NOFOLLOW: never through a planted link
        try:
            _pwrite_all(self.fd, self.header, 0)
            fsio.allocate(self.fd, self.size)
        except BaseException:
            self.close(sync=False)
            raise

    def write(self, block: int, row: int, data: np.ndarray) -> None:
        """Write ``data`` (rows, width) at ``row`` of ``block``; rows of a block must come in order."""
        if row != self.next_row[block]:
            raise RuntimeError(f"{self.path.name}: block {block} expected row {self.next_row[block]}, got {row}")
        data = np.ascontiguousarray(data, dtype=self.dtype)
        raw = data.reshape(-1).view(np.uint8)
        fault_point("write")
        _pwrite_all(self.fd, raw, len(self.header) + block * self.block_bytes + row * self.row_bytes)
        self.crcs[block] = crc32(raw, self.crcs[block])
        self.next_row[block] = row + data.shape[0]

    def complete(self) -> bool:
        return all(n == self.shape[1] for n in self.next_row)

    def close(self, sync: bool = True) -> None:
        if self.fd < 0:
            return
        try:
            if sync:
                fsio.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.fd = -1

    def meta(self) -> dict:
        """The manifest entry of this file (format 2)."""
        return {"bytes": self.size, "header_bytes": len(self.header),
                "header_crc32": f"{crc32(self.header):08x}",
                "layer_crc32": [f"{c:08x}" for c in self.crcs]}


def save_column(path: Path, array: np.ndarray) -> None:
    """``np.save`` a token column, fsynced (the shard is renamed into place only after this)."""
    with fsio.open_new_file(path) as fh:  # O_EXCL | O_NOFOLLOW
        np.save(fh, array, allow_pickle=False)
        fsio.fsync_file(fh)
