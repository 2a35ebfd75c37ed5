"""A store as safetensors files, and such an export read back as an import source.

Layout: ``OUT/00000.safetensors, 00001.safetensors, ...`` — one file per store shard, or per run of its rows
when a shard over the selected blocks exceeds ``file_bytes`` (memory holds one file's tensors). Each file holds

* one tensor per site and layer, named as the store names it (``resid_post.3``, ``embed``): (token, d_model)
  in the stored dtype — float32 as F32, float16 as F16, bfloat16 as BF16 (the store's ``uint16`` bit
  patterns, reinterpreted, not converted);
* the token table: ``tokens.doc``, ``tokens.window``, ``tokens.pos``, ``tokens.doc_pos``, ``tokens.token_id``,
  ``tokens.next_token_id`` (I64), ``tokens.special`` (BOOL), and the token text as UTF-8 bytes
  ``tokens.token_utf8`` (U8) cut by ``tokens.token_offsets`` (I64, rows + 1);
* ``__metadata__`` (strings): ``format`` (``lens-activation-export``), ``format_version``, ``source`` (JSON:
  the store's path, model id and revision, n_layers, d_model, dtype, the exported sites and layers,
  positions, n_tokens, its ``manifest_sha256``), ``file`` (JSON: index and count of files, the store shard,
  its windows, the rows of the shard this file holds, the first token's index in the whole export, the width of
  its token text column),
  ``source_layer_crc32`` (JSON: tensor -> the store's CRC-32 of that layer block, when the file holds the
  whole block: the same bytes, so the same checksum) and ``lens_manifest`` (the store's manifest without its
  shard list, for an exact re-import).

Read with no project code::

    from safetensors import safe_open
    with safe_open("OUT/00000.safetensors", "pt") as f:
        x = f.get_tensor("resid_post.3"); meta = f.metadata()

Every file is read back after it is written and compared with the rows it came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lens.errors import LensInputError, StoreCorruptError
from lens.store.exchange.selection import Block, row_bytes, row_chunks, same_bytes, select
from lens.store.exchange.staging import staged
from lens.store.format import CHECKSUM_KEY, TOKEN_COLUMNS, site_width
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


def plan_files(manifest: dict, blocks: list[Block], file_bytes: int = FILE_BYTES) -> list[tuple[dict, int, int]]:
    """(shard, first row, row after the last) of every file, in order."""
    per = max(1, file_bytes // max(1, row_bytes(manifest, blocks)))
    return [(s, lo, hi) for s in manifest["shards"] for lo, hi in row_chunks(int(s["n_tokens"]), per)]


def export_size(manifest: dict, blocks: list[Block]) -> int:
    return int(manifest["n_tokens"]) * (row_bytes(manifest, blocks) + 8 * 8 + 32) + 65536 * max(1, len(manifest["shards"]))


def export_safetensors(store, out, sites=None, layers=None, progress: bool = False,
                       file_bytes: int = FILE_BYTES) -> Path:
    """Write ``store`` (a disk store) as safetensors files into the new folder ``out``; returns it."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    if store.root is None:
        raise LensInputError("only a store on disk can be exported (open it with lens.open_store)")
    m = store.manifest
    blocks = select(m, sites, layers)
    plan = plan_files(m, blocks, file_bytes)
    files = ShardFiles(store.root, m, verify=True, check_nonfinite=False)  # every block's CRC checked as it is read
    src = source_record(store, blocks)
    head = {k: v for k, v in m.items() if k not in ("shards", CHECKSUM_KEY)}
    bar = tqdm(total=int(m["n_tokens"]), unit="tok", desc=f"export {store.root} to safetensors", disable=not progress)
    token0 = 0
    try:
        with staged(out, export_size(m, blocks)) as tmp:
            for i, (shard, lo, hi) in enumerate(plan):
                whole = lo == 0 and hi == int(shard["n_tokens"])
                tensors, crcs = {}, {}
                for b in blocks:
                    data = files.layer_block(shard, b.site, b.idx)  # CRC-checked on first read
                    tensors[b.key] = _tensor(data[lo:hi], m["dtype"])
                    if whole:
                        crcs[b.key] = shard["files"][f"{b.site}.npy"]["layer_crc32"][b.idx]
                for col in TOKEN_COLUMNS:
                    values = files.token_column(shard, col)[lo:hi]
                    if col == "token":
                        tensors.update(text_tensors(values))
                    else:
                        tensors[f"tokens.{col}"] = torch.from_numpy(np.ascontiguousarray(values))
                meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "source": json.dumps(src),
                        "file": json.dumps({"index": i, "count": len(plan), "shard": shard["name"],
                                            "window_start": shard["window_start"], "window_end": shard["window_end"],
                                            "shard_rows": int(shard["n_tokens"]), "row_start": lo, "row_end": hi,
                                            "token_start": token0,
                                            "token_chars": files.token_column(shard, "token").dtype.itemsize // 4}),
                        "source_layer_crc32": json.dumps(crcs), "lens_manifest": json.dumps(head)}
                path = tmp / f"{i:05d}.safetensors"
                save_file(tensors, str(path), metadata=meta)
                with safe_open(str(path), "pt") as fh:  # read back: every tensor as it was meant
                    if fh.metadata() != meta or set(fh.keys()) != set(tensors):
                        raise StoreCorruptError(f"{path}: reads back with other tensors or metadata than were written")
                    for name, t in tensors.items():  # bit for bit (a NaN equals itself here)
                        if not same_bytes(_bits(fh.get_tensor(name)).numpy(), _bits(t).numpy()):
                            raise StoreCorruptError(f"{path}: tensor {name} reads back other values than were written")
                del tensors
                token0 += hi - lo
                bar.update(hi - lo)
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
    from safetensors import safe_open

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
    from lens.store.exchange.importer import Piece

    groups: list[list[ExportFile]] = []
    for f in files:
        if groups and groups[-1][0].file["shard"] == f.file["shard"]:
            groups[-1].append(f)
        else:
            groups.append([f])
    for group in groups:
        first = group[0].file
        row = 0
        for f in group:
            if f.file["row_start"] != row:
                raise StoreCorruptError(f"{f.path}: holds rows {f.file['row_start']}.. of shard {first['shard']}, "
                                        f"expected {row}: a file is missing")
            row = f.file["row_end"]
        if row != first["shard_rows"]:
            raise StoreCorruptError(f"{group[-1].path}: shard {first['shard']} ends at row {row} of {first['shard_rows']}")
        yield Piece(first["window_start"], first["window_end"], first["shard_rows"],
                    tokens=lambda g=group: _group_tokens(g), chunks=lambda g=group: _group_chunks(g, manifest))


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
    for f in group:
        n = f.file["row_end"] - f.file["row_start"]
        with _open(f.path) as fh:
            names = set(fh.keys())
            out = {}
            for site, layers in manifest["sites"].items():
                rows = []
                for l in layers:
                    key = site if l is None else f"{site}.{l}"
                    if key not in names:
                        raise StoreCorruptError(f"{f.path}: tensor {key} is missing")
                    t = fh.get_tensor(key)
                    want = (n, site_width(manifest, site))
                    if tuple(t.shape) != want:
                        raise StoreCorruptError(f"{f.path}: tensor {key} has shape {tuple(t.shape)}, expected {want}")
                    rows.append(_storage(t))
                out[site] = np.stack(rows)
        yield f.file["row_start"], out


__all__ = ["export_safetensors", "read_export", "export_pieces", "plan_files", "FORMAT"]
