"""A store as safetensors files, and such an export read back as an import source.

Layout: ``OUT/00000.safetensors, 00001.safetensors, ...`` — one file per store shard, or per group of its
site-layers when the shard's selected blocks exceed ``file_bytes`` (memory holds one file's tensors; each layer
block is read once, whole, and checked against its CRC). Each file holds

* one tensor per site and layer of its group, named as the store names it (``resid_post.3``, ``embed``): (token, d_model)
  in the stored dtype — float32 as F32, float16 as F16, bfloat16 as BF16 (the store's ``uint16`` bit
  patterns, reinterpreted, not converted);
* the token table: ``tokens.doc``, ``tokens.window``, ``tokens.pos``, ``tokens.doc_pos``, ``tokens.token_id``,
  ``tokens.next_token_id`` (I64), ``tokens.special`` (BOOL), and the token text as UTF-8 bytes
  ``tokens.token_utf8`` (U8) cut by ``tokens.token_offsets`` (I64, rows + 1);
* ``__metadata__`` (strings): ``format`` (``lens-activation-export``), ``format_version``, ``source`` (JSON:
  the store's path, model id and revision, n_layers, d_model, dtype, the exported sites and layers,
  positions, n_tokens, its ``manifest_sha256``), ``file`` (JSON: index and count of files, the store shard,
  its windows and rows, the site-layers this file holds, the first token's index in the whole export, the width
  of its token text column),
  ``source_layer_crc32`` (JSON: tensor -> the store's CRC-32 of that layer block: the same bytes, so the same
  checksum) and ``lens_manifest`` (the store's manifest without its
  shard list, for an exact re-import).

Read with no project code::

    from safetensors import safe_open
    with safe_open("OUT/00000.safetensors", "pt") as f:
        x = f.get_tensor("resid_post.3"); meta = f.metadata()

Every file is read back after it is written and compared with the rows it came from.
"""

from __future__ import annotations

from contextlib import closing
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import safetensors.torch  # called as safetensors.torch.save_file: late-bound, a test fills the disk through it
from safetensors import safe_open
from tqdm.auto import tqdm

from lens.errors import LensInputError, StoreCorruptError
from lens.store.exchange.importer import Piece
from lens.store.exchange.selection import (Block, BufferPool, prefetched, read_block, require_on_disk, row_bytes,
                                          same_bytes, select)
from lens.store.exchange.staging import staged
from lens.store.format import CHECKSUM_KEY, TOKEN_COLUMNS, site_width, storage_np_dtype
from lens.store.shardfiles import ShardFiles

FORMAT = "lens-activation-export"
FORMAT_VERSION = "1"
FILE_BYTES = 256 << 20  # a file's tensors (memory holds one file at a time)
INT_COLUMNS = ("doc", "window", "pos", "doc_pos", "token_id", "next_token_id")


def _tensor(a: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def _storage(t: torch.Tensor) -> np.ndarray:
    """A tensor read from a file as the store's storage array (BF16 -> uint16 bit patterns)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def text_tensors(texts: np.ndarray) -> dict:
    raw = [str(s).encode("utf-8") for s in texts]
    offsets = np.zeros(len(raw) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in raw])
    data = np.frombuffer(b"".join(raw), dtype=np.uint8).copy()
    return {"tokens.token_utf8": torch.from_numpy(data), "tokens.token_offsets": torch.from_numpy(offsets)}


def texts_of(utf8: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    raw = np.asarray(utf8, dtype=np.uint8).tobytes()
    return np.asarray([raw[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)], dtype=str)


def source_record(store, blocks: list[Block]) -> dict:
    m = store.manifest
    chosen: dict = {}
    for b in blocks:
        chosen.setdefault(b.site, []).append(b.layer)
    return {"path": str(Path(store.root).resolve()), "model_id": m["model"]["model_id"],
            "revision": m["model"].get("revision"), "n_layers": m["model"]["n_layers"], "d_model": m["d_model"],
            "dtype": m["dtype"], "sites": chosen, "positions": m.get("positions", "all"), "n_tokens": m["n_tokens"],
            "manifest_sha256": m.get(CHECKSUM_KEY)}


def plan_files(manifest: dict, blocks: list[Block], file_bytes: int = FILE_BYTES) -> list[tuple[dict, list[Block]]]:
    """(shard, its site-layers in this file) of every file, in order: a shard's blocks grouped up to ``file_bytes``."""
    itemsize = storage_np_dtype(manifest["dtype"]).itemsize
    out = []
    for shard in manifest["shards"]:
        group, size = [], 0
        for b in blocks:
            nbytes = int(shard["n_tokens"]) * site_width(manifest, b.site) * itemsize
            if group and size + nbytes > file_bytes:
                out.append((shard, group))
                group, size = [], 0
            group.append(b)
            size += nbytes
        out.append((shard, group))
    return out


def export_size(manifest: dict, blocks: list[Block]) -> int:
    return int(manifest["n_tokens"]) * (row_bytes(manifest, blocks) + 8 * 8 + 32) + 65536 * max(1, len(manifest["shards"]))


def export_safetensors(store, out, sites=None, layers=None, progress: bool = False,
                       file_bytes: int = FILE_BYTES) -> Path:
    """Write ``store`` (a disk store) as safetensors files into the new folder ``out``; returns it."""
    require_on_disk(store)
    m = store.manifest
    blocks = select(m, sites, layers)
    plan = plan_files(m, blocks, file_bytes)
    files = ShardFiles(store.root, m, verify=True)  # sizes, headers and token columns checked; blocks: read_block
    src = source_record(store, blocks)
    head = {k: v for k, v in m.items() if k not in ("shards", CHECKSUM_KEY)}
    bar = tqdm(total=int(m["n_tokens"]), unit="tok", desc=f"export {store.root} to safetensors", disable=not progress)
    token0 = 0
    try:
        pool = BufferPool()  # the blocks' arrays, reused once their file is written and read back

        def blocks_read():  # in a thread, one file ahead of its writing: read with one preadv each, CRC-checked
            for shard, group in plan:
                yield {b.key: read_block(files, m, shard, b, pool) for b in group}

        with staged(out, export_size(m, blocks)) as tmp, closing(prefetched(blocks_read())) as reads:
            for i, ((shard, group), read) in enumerate(zip(plan, reads)):
                n = int(shard["n_tokens"])
                if i and plan[i - 1][0] is not shard:
                    token0 += int(plan[i - 1][0]["n_tokens"])
                arrays = dict(read)
                del read
                tensors = {key: _tensor(a, m["dtype"]) for key, a in arrays.items()}
                crcs = {b.key: shard["files"][f"{b.site}.npy"]["layer_crc32"][b.idx] for b in group}
                for col in TOKEN_COLUMNS:
                    values = files.token_column(shard, col)
                    if col == "token":
                        tensors.update(text_tensors(values))
                        chars = values.dtype.itemsize // 4
                    else:
                        tensors[f"tokens.{col}"] = torch.from_numpy(np.ascontiguousarray(values))
                meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "source": json.dumps(src),
                        "file": json.dumps({"index": i, "count": len(plan), "shard": shard["name"],
                                            "window_start": shard["window_start"], "window_end": shard["window_end"],
                                            "shard_rows": n, "blocks": [b.key for b in group], "token_start": token0,
                                            "token_chars": chars}),
                        "source_layer_crc32": json.dumps(crcs), "lens_manifest": json.dumps(head)}
                path = tmp / f"{i:05d}.safetensors"
                safetensors.torch.save_file(tensors, str(path), metadata=meta)
                with safe_open(str(path), "pt") as fh:  # read back: every tensor as it was meant
                    if fh.metadata() != meta or set(fh.keys()) != set(tensors):
                        raise StoreCorruptError(f"{path}: reads back with other tensors or metadata than were written")
                    for name, t in tensors.items():  # bit for bit (a NaN equals itself here)
                        if not same_bytes(_bits(fh.get_tensor(name)).numpy(), _bits(t).numpy()):
                            raise StoreCorruptError(f"{path}: tensor {name} reads back other values than were written")
                del tensors
                pool.give(arrays.values())  # written and read back: nothing refers to them any more
                del arrays
                if i + 1 == len(plan) or plan[i + 1][0] is not shard:
                    bar.update(n)
    finally:
        bar.close()
    return Path(out)


# --------------------------------------------------------------------------- reading an export back
@dataclass
class ExportFile:
    path: Path
    meta: dict
    file: dict


def _open(path: Path):
    try:
        return safe_open(str(path), "pt")
    except Exception as exc:  # noqa: BLE001 - SafetensorError and OSError: a damaged or foreign file
        raise StoreCorruptError(f"{path}: not a readable safetensors file ({' '.join(str(exc).split())})") from None


def read_export(src) -> tuple[dict, list[ExportFile]]:
    """The source record and files of a safetensors export folder (or one file), checked: one export,
    every file present once, rows contiguous. Refused with one line otherwise."""
    src = Path(src)
    if not src.exists():
        raise LensInputError(f"{src}: not found (expected a folder written by lens store export --to safetensors)")
    paths = sorted(src.glob("*.safetensors")) if src.is_dir() else [src]
    if not paths:
        raise LensInputError(f"{src}: holds no .safetensors file")
    out = []
    for p in paths:
        with _open(p) as fh:
            meta = fh.metadata() or {}
        if meta.get("format") != FORMAT:
            raise LensInputError(f"{p}: not a lens safetensors export (its __metadata__ has format "
                                 f"{meta.get('format')!r}); for vLLM's hidden-states files use --from vllm")
        try:
            out.append(ExportFile(p, meta, json.loads(meta["file"])))
        except (KeyError, ValueError) as exc:
            raise StoreCorruptError(f"{p}: its __metadata__ is damaged ({exc})") from None
    source = json.loads(out[0].meta["source"])
    count = out[0].file["count"]
    if len(out) != count or [f.file["index"] for f in out] != list(range(count)):
        raise StoreCorruptError(f"{src}: the export has {count} files, {len(out)} are here "
                                f"({', '.join(str(f.file['index']) for f in out[:8])}): some are missing or foreign")
    for f in out:
        if json.loads(f.meta["source"]) != source:
            raise StoreCorruptError(f"{f.path}: belongs to another export (its source differs from {out[0].path}'s)")
    return source, out


def export_pieces(files: list[ExportFile], manifest: dict):
    """The export as import pieces (:class:`lens.store.exchange.importer.Piece`), one per store shard."""
    groups: list[list[ExportFile]] = []
    for f in files:
        if groups and groups[-1][0].file["shard"] == f.file["shard"]:
            groups[-1].append(f)
        else:
            groups.append([f])
    for group in groups:
        first = group[0].file
        keys = [k for f in group for k in f.file.get("blocks", [])]
        want = [s if l is None else f"{s}.{l}" for s, ls in manifest["sites"].items() for l in ls]
        if sorted(keys) != sorted(want):
            raise StoreCorruptError(f"{group[0].path}: the files of shard {first['shard']} hold {len(keys)} of the "
                                    f"{len(want)} site-layers of the export: a file is missing")
        yield Piece(first["window_start"], first["window_end"], first["shard_rows"],
                    tokens=lambda g=group: _group_tokens(g[:1]), chunks=lambda g=group: _group_chunks(g, manifest))


def _group_tokens(group: list[ExportFile]) -> dict:
    cols: dict = {c: [] for c in TOKEN_COLUMNS}
    for f in group:
        with _open(f.path) as fh:
            for c in INT_COLUMNS + ("special",):
                cols[c].append(fh.get_tensor(f"tokens.{c}").numpy())
            cols["token"].append(texts_of(fh.get_tensor("tokens.token_utf8").numpy(),
                                          fh.get_tensor("tokens.token_offsets").numpy()))
    out = {c: np.concatenate(v) for c, v in cols.items()}
    width = group[0].file.get("token_chars")  # the store's text column width (a capture's: its whole plan's)
    if width and out["token"].dtype.itemsize // 4 <= width:
        out["token"] = out["token"].astype(f"<U{width}")
    return out


def _group_chunks(group: list[ExportFile], manifest: dict):
    index = {(s if l is None else f"{s}.{l}"): (s, i) for s, ls in manifest["sites"].items() for i, l in enumerate(ls)}
    for f in group:
        n = f.file["shard_rows"]
        out = {}
        with _open(f.path) as fh:
            names = set(fh.keys())
            for key in f.file["blocks"]:
                if key not in names or key not in index:
                    raise StoreCorruptError(f"{f.path}: tensor {key} is missing")
                site, idx = index[key]
                t = fh.get_tensor(key)
                want = (n, site_width(manifest, site))
                if tuple(t.shape) != want:
                    raise StoreCorruptError(f"{f.path}: tensor {key} has shape {tuple(t.shape)}, expected {want}")
                out[(site, idx)] = _storage(t)
        yield 0, out


__all__ = ["export_safetensors", "read_export", "export_pieces", "plan_files", "FORMAT"]
