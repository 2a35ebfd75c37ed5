"""One capture split across processes or machines (``--part i/N``), and the merge of its parts.

Partition: a part plans the whole capture exactly as a single process does (the whole corpus cut
into windows, the windows into shards of ``shard_windows``) and then captures a contiguous run of
whole shards: with ``S`` shards in the plan, part ``i`` of ``N`` (1-based) takes shards
``floor((i-1) S / N) .. floor(i S / N) - 1``. Its shards therefore hold the same windows, cut into the
same batches, with the same token table (global ``doc`` and ``window`` ids, token text of the same
width) as the shards of the same windows in a single-process capture: byte for byte the same files.

A part is a store of its own (readable, verifiable, resumable with ``--resume``); its manifest
records the split in ``part`` (``index``, ``count``, its ``window_start`` / ``window_end`` in the
whole plan, the plan's ``n_windows_total`` / ``n_tokens_total``) and its settings carry
``part: "i/N"``, so a part is never resumed as another.

Merge (:func:`merge_stores`): the parts must be complete, format 2, of one model and one set of
settings (everything but ``part``), one split, and every part given exactly once. Each input byte is
read once and checked against its checksum (and the non-finite counts recounted) as it is copied
into the new store, which is written by the same commit protocol as a capture (writer lock,
``*.partial`` shards renamed into place, the sealed manifest committed after each shard). The result
equals a single-process capture of the same settings: same shards, same token table, and a manifest
that differs only in ``created`` and the provenance list ``merged_from``.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from lens.errors import LensInputError, StoreCorruptError
from lens.store.checksum import crc32
from lens.store.fidelity import merged_record
from lens.runtime.frozen_json import thaw
from lens.store.format import MANIFEST, TOKEN_COLUMNS, compared_settings, load_manifest, settings_fingerprint
from lens.store.lock import LOCK
from lens.store.manifest import Manifest, PartRecord, ShardEntry
from lens.store.shardfiles import ShardFiles
from lens.store.verify import _count_nonfinite
from lens.store.writer import ShardWriter, discard_unfinished, take_writer_lock

log = logging.getLogger(__name__)

COPY_ROWS = 4096  # rows of a layer block copied (and checked) at a time: memory stays flat


@dataclass(frozen=True)
class Part:
    index: int  # 1-based
    count: int

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_part(spec) -> Part | None:
    """``None``, ``"i/N"``, ``(i, N)`` or a :class:`Part` -> a checked Part (1 <= i <= N)."""
    if spec is None or isinstance(spec, Part):
        return spec
    try:
        if isinstance(spec, str):
            i, sep, n = spec.strip().partition("/")
            if not sep:
                raise ValueError
            index, count = int(i), int(n)
        else:
            index, count = (int(x) for x in spec)
    except (ValueError, TypeError):
        raise LensInputError(f"--part expects i/N (for example 2/3), got {spec!r}") from None
    if count < 1 or not 1 <= index <= count:
        raise LensInputError(f"--part {index}/{count}: expected 1 <= i <= N (parts are numbered from 1)")
    return Part(index, count)


def part_windows(part: Part, n_windows: int, shard_windows: int) -> tuple[int, int]:
    """The windows ``[start, end)`` of the whole plan that ``part`` captures: a run of whole shards."""
    n_shards = -(-n_windows // shard_windows)
    if part.count > n_shards:
        raise LensInputError(
            f"--part {part.label}: this capture cuts into only {n_shards} shard{'s' if n_shards != 1 else ''} "
            f"({n_windows} windows, {shard_windows} per shard), so it cannot be split into {part.count} parts: "
            f"use at most {n_shards} part{'s' if n_shards != 1 else ''}, or a smaller --shard-tokens")
    first = (part.index - 1) * n_shards // part.count
    last = part.index * n_shards // part.count
    return first * shard_windows, min(last * shard_windows, n_windows)


def part_record(part: Part, start: int, end: int, n_windows: int, n_tokens: int) -> dict:
    """The manifest's ``part`` entry."""
    return {"index": part.index, "count": part.count, "window_start": int(start), "window_end": int(end),
            "n_windows_total": int(n_windows), "n_tokens_total": int(n_tokens)}


# --------------------------------------------------------------------------- merge
def _read_part(root: Path) -> Manifest:
    if not root.is_dir():
        raise LensInputError(f"cannot merge {root}: store not found (expected a store folder)")
    m = load_manifest(root)  # schema and seal checked; StoreCorruptError names the file
    if m.format_version < 2 or m.part is None:
        raise LensInputError(f"cannot merge {root}: it is not a part of a split capture (captured without "
                             "--part i/N); only the parts of one capture merge")
    p = m.part
    if not m.complete:
        raise LensInputError(
            f"cannot merge {root}: part {p.label} is incomplete ({m.n_tokens} of "
            f"{'?' if m.n_tokens_planned is None else m.n_tokens_planned} tokens); finish it with the same "
            f"`lens capture ... --part {p.label} --resume` first")
    return m


def _part(m: Manifest) -> PartRecord:
    """A part's ``part`` record (:func:`_read_part` refused a store without one)."""
    if m.part is None:  # an internal order error: every caller reads parts through _read_part first
        raise RuntimeError("a part's manifest without its part record reached the merge")
    return m.part


def _differences(a: Mapping, b: Mapping, keys) -> list[str]:
    return [k for k in keys if a.get(k) != b.get(k)]


def _check_same(roots: list[Path], manifests: list[Manifest]) -> None:
    """Refuse parts of different models, corpora or settings (everything but the part itself)."""
    r0, m0 = roots[0], manifests[0]
    # a part that records no sample holds the first tokens
    s0 = compared_settings({k: v for k, v in (m0.settings or {}).items() if k != "part"})
    for root, m in zip(roots[1:], manifests[1:]):
        where = f"cannot merge {root} with {r0}"
        if m.model != m0.model:
            ids = (m0.model.get("model_id"), m.model.get("model_id"))
            what = (f"{ids[0]} and {ids[1]}" if ids[0] != ids[1] else
                    f"{ids[0]} with different " + ", ".join(_differences(m0.model, m.model,
                                                                          sorted(set(m0.model) | set(m.model)))[:4]))
            raise LensInputError(f"{where}: they were captured from different models ({what})")
        s = compared_settings({k: v for k, v in (m.settings or {}).items() if k != "part"})
        diff = _differences(s0, s, sorted(set(s0) | set(s)))
        if diff:
            shown = "; ".join(f"{k}: {r0} has {s0.get(k)!r}, {root} has {s.get(k)!r}" for k in diff[:3])
            raise LensInputError(f"{where}: they were captured with different settings ({shown})")
        diff = [k for k in ("corpus", "sites", "d_model", "widths", "dtype", "storage_dtype")
                if getattr(m0, k) != getattr(m, k)]
        if diff:
            raise LensInputError(f"{where}: their stores differ in {', '.join(diff)}")
        p0, p = _part(m0), _part(m)
        if p.count != p0.count or p.n_windows_total != p0.n_windows_total:
            raise LensInputError(f"{where}: they are parts of different splits (part {p0.label} "
                                 f"and part {p.label})")
        if m.library_versions != m0.library_versions:
            log.warning("merging parts captured with different library versions (%s: %s; %s: %s): the merged store "
                        "may differ from a single capture in the last bits", r0, thaw(m0.library_versions), root,
                        thaw(m.library_versions))


def _check_cover(roots: list[Path], manifests: list[Manifest]) -> list[tuple[Path, Manifest]]:
    """The parts in order, refused unless each of 1..N is given once and their windows tile the plan."""
    count = _part(manifests[0]).count
    by_index: dict = {}
    for root, m in zip(roots, manifests):
        i = _part(m).index
        if i in by_index:
            raise LensInputError(f"cannot merge: part {i}/{count} is given twice ({by_index[i][0]} and {root}); "
                                 "each part must be given once (overlapping parts)")
        by_index[i] = (root, m)
    missing = [i for i in range(1, count + 1) if i not in by_index]
    if missing:
        given = ", ".join(f"{i}/{count}" for i in sorted(by_index))
        want = ", ".join(f"{i}/{count}" for i in missing)
        raise LensInputError(f"cannot merge: part{'s' if len(missing) > 1 else ''} {want} "
                             f"{'are' if len(missing) > 1 else 'is'} missing (given: {given}); capture "
                             f"{'them' if len(missing) > 1 else 'it'} with --part and merge all {count}")
    ordered = [by_index[i] for i in range(1, count + 1)]
    window = 0
    for root, m in ordered:
        p = _part(m)
        if p.window_start != window:
            raise LensInputError(f"cannot merge: part {p.index}/{count} ({root}) covers windows "
                                 f"{p.window_start}..{p.window_end}, expected it to start at {window} "
                                 "(overlapping or missing windows)")
        window = p.window_end
    total = _part(ordered[0][1]).n_windows_total
    if window != total:
        raise LensInputError(f"cannot merge: the parts cover windows 0..{window} of {total}")
    return ordered


def _merged_manifest(ordered: list[tuple[Path, Manifest]]) -> Manifest:
    """The merged store's manifest: part 1's fields, the shards to come, the provenance of every part.

    Its fidelity record (``fidelity``, lens.store.fidelity.merged_record) holds every part's record (each part
    measured its own on its own first windows) and is itself the worst of them, marked with its part: a part
    captured with --allow-silently-wrong makes the merged store's record silently wrong (kept), which ``store
    info``, every result, the explorer and the findings then show. All parts ok: part 1's record (measured on the
    plan's first windows, as a single capture of the same settings measures its own) with ``part`` and ``parts``
    added, so the merge equals a single capture but for ``created``, ``merged_from`` and those two."""
    m0, p0 = ordered[0][1], _part(ordered[0][1])
    settings = {k: v for k, v in thaw(m0.settings or {}).items() if k != "part"}
    return m0.without("part", "checksum").with_(
        settings=settings, fingerprint=settings_fingerprint(settings), shards=(), n_tokens=0,
        nonfinite={s: [0] * len(l) for s, l in m0.sites.items()}, complete=False,
        n_tokens_planned=p0.n_tokens_total, n_windows_planned=p0.n_windows_total,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        merged_from=[{"path": str(root.resolve()), "part": _label(m), "created": m.created,
                      "manifest_sha256": m.checksum, "fidelity": _verdict(m)} for root, m in ordered],
        fidelity=merged_record([(_label(m), thaw(m.fidelity)) for _, m in ordered])).checked("the merged manifest")


def _label(m: Manifest) -> str:
    return _part(m).label


def _verdict(m: Manifest) -> str:
    """A part's fidelity verdict, for the merged store's provenance."""
    record = m.fidelity
    if not isinstance(record, Mapping):
        return "not recorded"
    return str(record.get("verdict")) + (" (accepted)" if record.get("accepted") else "")


def _copy_shard(writer: ShardWriter, files: ShardFiles, m: Manifest, shard: ShardEntry) -> None:
    """Copy one shard of a part into ``writer``'s open shard, checking every byte read."""
    n = shard.n_tokens
    for site, layers in m.sites.items():
        path, header = files.site_file(shard, site)  # regular file, recorded size, header checksum and shape
        fmeta = shard.file(f"{site.value}.npy")
        data = np.memmap(path, dtype=header.dtype, mode="r", offset=header.data_offset, shape=header.shape)
        try:
            for idx in range(len(layers)):
                crc, bad = 0, 0
                for r0 in range(0, n, COPY_ROWS):
                    rows = np.array(data[idx, r0:r0 + COPY_ROWS])
                    crc = crc32(rows.reshape(-1).view(np.uint8), crc)
                    count = _count_nonfinite(rows, m.dtype)
                    bad += count
                    writer.add_rows(site.value, idx, r0, rows, count)
                if f"{crc:08x}" != fmeta["layer_crc32"][idx]:
                    raise StoreCorruptError(f"{path}: layer block {idx} fails its checksum (crc32 {crc:08x}, "
                                            f"manifest {fmeta['layer_crc32'][idx]}): the part is damaged")
                recorded = shard.nonfinite[site][idx] if shard.nonfinite is not None else None
                if bad != recorded:
                    raise StoreCorruptError(f"{path}: layer block {idx} holds {bad} non-finite values, the "
                                            f"manifest records {recorded}")
        finally:
            del data
    writer.finish({col: files.token_column(shard, col) for col in TOKEN_COLUMNS})  # each column CRC-checked


def _check_out_apart(out: Path, roots: list[Path]) -> None:
    """Refuse an output folder that is a part, lies inside one, or holds one (links resolved): the merge
    would write into a part, or delete it when it cleans up after a failure."""
    target = out.resolve()
    for root in roots:
        part = root.resolve()
        if target == part:
            raise LensInputError(f"--out {out} is one of the parts: merge into a new folder outside the parts")
        if part in target.parents:
            raise LensInputError(f"--out {out} is inside the part {root}: merge into a new folder outside the parts "
                                 "(a part must stay as it was captured)")
        if target in part.parents:
            raise LensInputError(f"--out {out} holds the part {root}: merge into a new folder outside the parts")


def merge_stores(inputs, out, progress: bool = False) -> Path:
    """Merge the complete parts ``inputs`` (folders, any order) of one split capture into the new
    store ``out``; returns its path. Raises ``LensInputError`` (exit 2 on the command line) for parts
    that do not belong together, ``StoreCorruptError`` for a damaged part, ``StoreWriteError`` when
    ``out`` cannot be written (nothing is left behind then)."""
    roots = [Path(p) for p in inputs]
    if not roots:
        raise LensInputError("store merge needs the parts to merge: lens store merge PART... --out STORE")
    out = Path(out)
    _check_out_apart(out, roots)  # before anything is read or written
    manifests = [_read_part(r) for r in roots]
    _check_same(roots, manifests)
    ordered = _check_cover(roots, manifests)
    if out.exists() and (not out.is_dir() or any(p.name != LOCK for p in out.iterdir())):
        raise LensInputError(f"--out {out} already exists and is not empty: merge into a new folder")
    lock, created = take_writer_lock(out)
    manifest = _merged_manifest(ordered)
    writer = ShardWriter(out, manifest)
    bar = tqdm(total=manifest.n_tokens_planned, unit="tok", desc=f"merge into {out}", disable=not progress)
    try:
        writer.recover()
        writer.commit_manifest()
        for root, m in ordered:
            files = ShardFiles(root, m, verify=True)
            for shard in m.shards:
                writer.begin(shard.window_start, shard.window_end, shard.n_tokens)
                _copy_shard(writer, files, m, shard)
                bar.update(shard.n_tokens)
        writer.complete()
    except BaseException as exc:
        # the merge holds the lock: nothing of a half-made store is kept (the parts are untouched)
        discard_unfinished(writer, out, exc, " (the parts are untouched): fix that and run the merge again")
        raise
    finally:
        bar.close()
        lock.release()
        if created and out.is_dir() and not (out / MANIFEST).exists():
            shutil.rmtree(out, ignore_errors=True)
    return out


__all__ = ["Part", "parse_part", "part_windows", "part_record", "merge_stores"]
