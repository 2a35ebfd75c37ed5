"""Hidden states from elsewhere written as a checked store: the capture's commit protocol (writer lock,
``*.partial`` shards renamed into place, the sealed manifest committed after each shard), then every byte read
back against its checksum. A failed import leaves no store behind.

A source gives its data as :class:`Piece` s, one per shard of the new store: its windows, its token table
(``token`` text may be left out and is then decoded by ``text_of``) and its states in chunks
``(first row, {(site, index of the layer in the site's list): (rows, width) array})`` in the store's storage dtype
(bfloat16 as ``uint16`` bit patterns); each layer block's rows come in order, blocks in any order.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from tqdm.auto import tqdm

from lens.errors import LensInputError
from lens.store.exchange.staging import check_space, check_target
from lens.store.format import (DTYPES, FORMAT, FORMAT_VERSION, MANIFEST, TOKEN_COLUMNS, count_nonfinite_stored,
                               settings_fingerprint, storage_np_dtype)
from lens.store.manifest import Manifest
from lens.store.reader import open_store
from lens.store.writer import ShardWriter, discard_unfinished, take_writer_lock

SOURCE = "imported"  # the manifest field recording where an imported store came from


@dataclass
class Piece:
    window_start: int
    window_end: int
    n_tokens: int
    tokens: Callable[[], dict]
    chunks: Callable[[], Iterable[tuple[int, dict]]]


def window_tokens(ids_list: list[np.ndarray], window0: int, special_ids) -> dict:
    """The token table of windows that are each a document of their own (a vLLM request, a SAELens row):
    ``doc`` = ``window`` = its index, ``pos`` = ``doc_pos`` = the position in it, ``next_token_id`` the next
    token of the window (-1 at its end), ``special`` the tokenizer's special tokens."""
    cols: dict = {c: [] for c in TOKEN_COLUMNS if c != "token"}
    special = np.asarray(sorted(special_ids), dtype=np.int64)
    for j, ids in enumerate(ids_list):
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        w = window0 + j
        cols["doc"].append(np.full(n, w, np.int64))
        cols["window"].append(np.full(n, w, np.int64))
        cols["pos"].append(np.arange(n, dtype=np.int64))
        cols["doc_pos"].append(np.arange(n, dtype=np.int64))
        cols["token_id"].append(ids)
        cols["next_token_id"].append(np.append(ids[1:], -1).astype(np.int64))
        cols["special"].append(np.isin(ids, special))
    return {c: np.concatenate(v) if v else np.zeros(0, np.int64) for c, v in cols.items()}


def in_vocabulary(ids, card, where: str) -> None:
    """Refuse token ids outside ``card``'s vocabulary (states of another model, or ids of another tokenizer):
    a forward would fail on them, and the store's token texts would be another tokenizer's words."""
    ids = np.asarray(ids)
    if not card.get("d_vocab"):  # a card that does not say (a synthetic store's): nothing to check against
        return
    vocab = int(card["d_vocab"])
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise LensInputError(f"{where}: token id {bad} is outside {card['model_id']}'s vocabulary (0..{vocab - 1}): "
                             "states of another model, or token ids of another tokenizer")


def new_manifest(card: dict, sites: dict, dtype: str, n_tokens: int, n_windows: int, *, source: dict,
                 fidelity: dict | None, seq_len: int, library_versions: dict | None = None) -> Manifest:
    """The first manifest of an imported store (:meth:`Manifest.first`): the capture's fields, ``corpus`` naming
    the source, and ``imported`` (format, path, what the source said of itself) recording where the states came
    from."""
    settings = {"model_id": card["model_id"], "revision": card.get("revision"), "corpus": f"imported:{source['from']}",
                "seq_len": int(seq_len), "max_tokens": int(n_tokens), "dtype": dtype,
                "sites": [s if l is None else f"{s}.{l}" for s, ls in sites.items() for l in ls],
                "backend": f"imported from {source['from']}"}
    return Manifest.first({
        "format": FORMAT, "format_version": FORMAT_VERSION, "model": card,
        "corpus": {"name": f"imported:{source['from']}", "source": source["path"], "fingerprint": source.get("fingerprint"),
                   "transform": None},
        "settings": settings, "fingerprint": settings_fingerprint(settings), "sites": sites, "d_model": card["d_model"],
        "widths": {}, "dtype": dtype, "storage_dtype": DTYPES[dtype][2], "positions": "all", "sample": "first",
        "n_tokens": 0, "nonfinite": {s: [0] * len(l) for s, l in sites.items()}, "n_tokens_planned": int(n_tokens),
        "n_windows_planned": int(n_windows), "shards": [], "complete": False,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "library_versions": library_versions or {},
        "fidelity": fidelity, SOURCE: source,
    }, "the imported store's manifest")


def store_bytes(manifest: Manifest) -> int:
    itemsize = storage_np_dtype(manifest.dtype).itemsize
    per = sum(len(l) * manifest.width(s) for s, l in manifest.sites.items()) * itemsize
    return int(manifest.n_tokens_planned or 0) * (per + 64 + 4 * 48) + (1 << 20)


def write_store(out, manifest: Manifest, pieces: Iterable[Piece], text_of: Callable | None = None,
                progress: bool = False) -> Path:
    """Write ``pieces`` as the store ``out`` (a new folder) under ``manifest`` (its first manifest,
    :meth:`Manifest.first`); read it back and check every checksum; returns its path. Nothing is left at ``out``
    when it fails."""
    out = Path(out)
    check_target(out, "import")
    check_space(out, store_bytes(manifest), "the import")
    lock, created = take_writer_lock(out, work="import")
    writer = ShardWriter(out, manifest)
    dtype = manifest.dtype
    bar = tqdm(total=int(manifest.n_tokens_planned or 0), unit="tok", desc=f"import into {out}", disable=not progress)
    try:
        writer.recover()
        writer.commit_manifest()
        for piece in pieces:
            writer.begin(piece.window_start, piece.window_end, piece.n_tokens)
            fill = {(s.value, i): 0 for s, l in manifest.sites.items() for i in range(len(l))}
            for row, blocks in piece.chunks():
                for (site, idx), block in blocks.items():
                    if fill[(site, idx)] != row:
                        raise LensInputError(f"the source gives rows {row}.. of {site} layer block {idx} where "
                                             f"{fill[(site, idx)]} was expected")
                    data = np.ascontiguousarray(block)
                    writer.add_rows(site, idx, row, data, count_nonfinite_stored(data, dtype))
                    fill[(site, idx)] = row + data.shape[0]
            tokens = piece.tokens()
            in_vocabulary(tokens["token_id"], manifest.model, f"windows {piece.window_start}..{piece.window_end - 1}")
            if "token" not in tokens:
                if text_of is None:
                    raise LensInputError("the source gives no token text and no tokenizer was given to decode it")
                tokens = {**tokens, "token": text_of(tokens["token_id"])}
            if len(tokens["token_id"]) != piece.n_tokens:
                raise LensInputError(f"the source's token table has {len(tokens['token_id'])} rows for "
                                     f"{piece.n_tokens} states")
            writer.finish(tokens)
            bar.update(piece.n_tokens)
        writer.complete()
        open_store(out).verify()  # read back: every byte against its checksum
    except BaseException as exc:
        discard_unfinished(writer, out, exc, ": fix that and run the import again")
        raise
    finally:
        bar.close()
        lock.release()
        if created and out.is_dir() and not (out / MANIFEST).exists():
            shutil.rmtree(out, ignore_errors=True)
    return out


__all__ = ["Piece", "window_tokens", "in_vocabulary", "new_manifest", "write_store", "SOURCE"]


@dataclass
class Source:
    """Hidden states from elsewhere, described and read: ``sites`` (site -> layers), the stored ``dtype``,
    ``n_windows`` / ``n_tokens``, the longest window ``seq_len``, ``record`` (the manifest's ``imported``),
    ``probes(k)`` (the first ``k`` windows as ``(token ids, {site: (layers, n, width)})``) and
    ``pieces(shard_tokens, special_ids)``."""

    sites: dict
    dtype: str
    n_windows: int
    n_tokens: int
    seq_len: int
    record: dict
    probes: Callable
    pieces: Callable


def windows_per_shard(shard_tokens: int, seq_len: int) -> int:
    return max(1, int(shard_tokens) // max(1, int(seq_len)))
