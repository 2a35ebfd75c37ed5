"""Checked access to the files of a store's shards: nothing is parsed before it is checked.

An activation file must be a regular file (not a link) of the size the manifest records; its ``.npy``
header must pass its CRC (format 2) and say exactly the dtype, order and shape the manifest implies
before a single data byte is mapped; each layer block is CRC-checked the first time it is read. A token
column is CRC-checked whole and its header checked (int64 / bool / unicode of the shard's length)
before numpy parses it — an object (pickled) column is refused unread. A layer block read for the first
time must also hold exactly the non-finite values its shard records (a store re-sealed after NaN was
written into it is refused, naming site and layer). Every failure is a
``StoreCorruptError`` whose message starts with the file's path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from lens.errors import StoreCorruptError
from lens.sites import Site
from lens.store.checksum import crc32
from lens.store.format import SHARDS, count_nonfinite_stored, crc32_file, storage_np_dtype
from lens.store.manifest import Manifest, ShardEntry
from lens.store.npyfile import parse_header, parse_header_bytes


def read_block_into(path: Path, data: np.ndarray, header, idx: int) -> np.ndarray:
    """Layer block ``idx`` of a checked ``.npy`` file (``header``: its parsed header) into ``data`` (of the block's
    shape and dtype), by positioned reads: a memory map's copy faults the page cache in page by page, ~3x the time
    of ``preadv`` (a store verify or an import reads every block once). A short file or a failed read is a
    ``StoreCorruptError`` naming the file."""
    raw = data.reshape(-1).view(np.uint8)
    offset = header.data_offset + idx * raw.size
    try:
        with open(path, "rb", buffering=0) as fh:
            got = 0
            while got < raw.size:
                k = os.preadv(fh.fileno(), [raw[got:]], offset + got)
                if k <= 0:
                    raise StoreCorruptError(f"{path}: ends inside layer block {idx}")
                got += k
    except OSError as exc:
        raise StoreCorruptError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return data


def _read_block(path: Path, header, idx: int) -> np.ndarray:
    """Layer block ``idx`` of a checked ``.npy`` file into a new array (:func:`read_block_into`)."""
    return read_block_into(path, np.empty(header.shape[1:], dtype=header.dtype), header, idx)


class ShardFiles:
    """The shard files of the store at ``root`` described by ``manifest``; ``verify=False`` skips the
    data CRCs (sizes and headers are always checked)."""

    def __init__(self, root: Path, manifest: Manifest | dict, verify: bool = True, check_nonfinite: bool = True):
        self.root = Path(root)
        self.manifest = Manifest.from_dict(manifest, validate=False)  # a value is kept as it is
        self.verify = verify
        self.check_nonfinite = check_nonfinite
        self._verified: set = set()
        self._headers: dict = {}  # (shard, file) -> (path, checked header)

    def layer_block(self, shard: ShardEntry | dict, site: Site | str, idx: int) -> np.ndarray:
        """Layer block ``idx`` of ``site`` in ``shard`` (a :class:`ShardEntry`, or its JSON object):
        (tokens, d_model), its CRC checked on first read."""
        shard, site = ShardEntry.from_dict(shard), Site.parse(site).value
        path, header = self.site_file(shard, site)
        try:
            block = np.memmap(path, dtype=header.dtype, mode="r", offset=header.data_offset, shape=header.shape)[idx]
        except (OSError, ValueError) as exc:
            raise StoreCorruptError(f"{path}: cannot be mapped ({exc})") from None
        meta = shard.files[f"{site}.npy"]
        if self.verify and (shard.name, site, idx) not in self._verified:
            data = _read_block(path, header, idx)  # the one copy we make anyway
            got = f"{crc32(data.reshape(-1).view(np.uint8)):08x}"
            if got != meta["layer_crc32"][idx]:
                raise StoreCorruptError(
                    f"{path}: layer block {idx} fails its checksum (crc32 {got}, manifest {meta['layer_crc32'][idx]}): "
                    "the file is damaged")
            if self.check_nonfinite:
                self._check_nonfinite(path, shard, site, idx, data)
            self._verified.add((shard.name, site, idx))
            return data
        return block

    def _check_nonfinite(self, path: Path, shard: ShardEntry, site: str, idx: int, data: np.ndarray) -> None:
        """The block holds exactly the NaN/inf values its shard records. The checksums cannot tell a
        store re-sealed after NaN was written into it; this can, so an analysis that trusts the recorded
        counts (``Store.require_usable``) is never handed a NaN the manifest hides."""
        recorded = None if shard.nonfinite is None else shard.nonfinite.get(Site(site))
        if recorded is None:  # format 1: no counts recorded
            return
        got = count_nonfinite_stored(data, self.manifest.dtype)
        if got != recorded[idx]:
            layer = self.manifest.sites[Site(site)][idx]
            at = site if layer is None else f"{site} layer {layer}"
            raise StoreCorruptError(
                f"{path}: {at} holds {got} non-finite values (NaN or inf) where the manifest records "
                f"{recorded[idx]}: the store was altered after its capture, and is refused (run `lens store verify "
                f"{self.root}`; recapture it)")

    def site_file(self, shard: ShardEntry | dict, site: Site | str):
        """Path and checked header of a shard's activation file: a regular file of the recorded size
        whose header (checksummed in format 2) says exactly the dtype and shape the manifest implies."""
        shard, site = ShardEntry.from_dict(shard), Site.parse(site).value
        key = (shard.name, f"{site}.npy")
        if key in self._headers:
            return self._headers[key]
        path = self.checked_file(shard, f"{site}.npy")
        meta = shard.files[f"{site}.npy"]
        want_dtype = storage_np_dtype(self.manifest.dtype)
        want_shape = (len(self.manifest.sites[Site(site)]), shard.n_tokens, self.manifest.width(site))
        try:
            with open(path, "rb") as fh:
                if "header_bytes" in meta:
                    raw = fh.read(meta["header_bytes"])
                    got = f"{crc32(raw):08x}"
                    if got != meta["header_crc32"]:
                        raise StoreCorruptError(f"{path}: .npy header fails its checksum (crc32 {got}, manifest "
                                                f"{meta['header_crc32']}): the header is damaged")
                    header = parse_header_bytes(raw, str(path))
                else:  # format 1: no header checksum; the header is checked against the manifest below
                    header = parse_header(fh, str(path))
        except OSError as exc:
            raise StoreCorruptError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if header.dtype != want_dtype or header.fortran_order or header.shape != want_shape:
            raise StoreCorruptError(
                f"{path}: .npy header says dtype {header.dtype.str}, shape {header.shape}"
                f"{', Fortran order' if header.fortran_order else ''}; the manifest implies {want_dtype.str}, "
                f"shape {want_shape}")
        want_size = header.data_offset + int(np.prod(want_shape)) * want_dtype.itemsize
        if want_size != meta["bytes"]:
            raise StoreCorruptError(f"{path}: header and data make {want_size} bytes, the manifest says {meta['bytes']}")
        self._headers[key] = (path, header)
        return path, header

    def checked_file(self, shard: ShardEntry | dict, fname: str) -> Path:
        """A shard file that exists as a regular file (not a link) of the size the manifest records."""
        shard = ShardEntry.from_dict(shard)
        path = self.root / SHARDS / shard.name / fname
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise StoreCorruptError(f"{path}: file is missing (shard {shard.name} is listed in the manifest)") from None
        except OSError as exc:
            raise StoreCorruptError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if not stat.S_ISREG(st.st_mode):
            raise StoreCorruptError(f"{path}: expected a regular file, found a {'link' if stat.S_ISLNK(st.st_mode) else 'non-file'}")
        if st.st_size != shard.files[fname]["bytes"]:
            raise StoreCorruptError(f"{path}: has {st.st_size} bytes, the manifest says "
                                    f"{shard.files[fname]['bytes']} (truncated or overwritten)")
        return path

    def file_crc(self, shard: ShardEntry | dict, fname: str, path: Path) -> None:
        shard = ShardEntry.from_dict(shard)
        key = (shard.name, fname)
        if not self.verify or key in self._verified:
            return
        try:
            got = crc32_file(path)
        except OSError as exc:
            raise StoreCorruptError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        want = shard.files[fname]["crc32"]
        if got != want:
            raise StoreCorruptError(f"{path}: fails its checksum (crc32 {got}, manifest {want}): the file is damaged")
        self._verified.add(key)

    def token_column(self, shard: ShardEntry | dict, col: str) -> np.ndarray:
        """One token column of one shard, checked (size, CRC-32, header) before numpy parses it."""
        shard = ShardEntry.from_dict(shard)
        fname = f"tokens.{col}.npy"
        path = self.checked_file(shard, fname)
        self.file_crc(shard, fname, path)
        try:
            with open(path, "rb") as fh:
                header = parse_header(fh, str(path))
        except OSError as exc:
            raise StoreCorruptError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        kind = {"special": "b", "token": "U"}.get(col, "i")
        ok = (header.dtype.kind == kind and not header.fortran_order and header.shape == (shard.n_tokens,)
              and (kind != "i" or header.dtype.str == "<i8"))
        if not ok:
            want = {"b": "bool", "U": "unicode text", "i": "int64 (<i8)"}[kind]
            raise StoreCorruptError(f"{path}: .npy header says dtype {header.dtype.str}, shape {header.shape}; "
                                    f"expected {want}, shape ({shard.n_tokens},)")
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise StoreCorruptError(f"{path}: cannot be loaded ({exc})") from None

