"""Capture: corpus -> windows -> batches -> backend hooks -> activation store.

``capture(model, corpus=..., sites=..., out=DIR)`` streams shards to disk; ``out=None`` keeps the
store in memory (on the model's device unless ``store_device`` says otherwise). Re-running the
same capture with ``resume=True`` continues after the last complete shard: windows and batches are
cut deterministically, so the result equals an uninterrupted run exactly.

Writing a store folder takes its writer lock (``lens.store.lock``) first, so a second capture or a
``--resume`` while one runs is refused. A folder left by a capture that died before its first
manifest commit holds nothing committed and is started afresh; a failed write (disk full, no
permission) removes the half-written shard and says how to resume (``StoreWriteError``).

Before the first shard, the bytes the store will take are computed from the plan
(:mod:`lens.capturing.size`), logged, and compared with the free space where ``out`` lies: a capture
that cannot fit is refused (``NotEnoughSpace``, exit 2) unless ``check_space=False``.
``positions`` (:mod:`lens.store.positions`: ``last``, ``every:K``, ``first:K``, ``0,5,-1``) keeps only those
positions of each window: the store's rows, token table included (its ``pos`` column says which
position each row is), are those rows; the manifest records them in ``positions``.
``sample`` (``spread`` or ``first``, :func:`lens.text.corpora.make_windows`) says which windows of a corpus
larger than ``max_tokens`` are captured; the manifest records it in ``sample`` (and ``sample_seed``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.capturing.backends import make_backend
from lens.capturing.spec import CAPTURE_DEFAULTS as _D, CaptureSpec, spec_from
from lens.capturing.batches import right_padded
from lens.text.corpora import Windows, check_sample_seed, load_corpus, make_windows, parse_sample, token_strings
from lens.runtime.devices import parse_device
from lens.errors import LensInputError, StoreWriteError
from lens.model.loading import load_model
from lens.model.loaded import LoadedModel
from lens.model.placement import is_dispatched
from lens.store.positions import ALL, keep_mask, parse_positions, positions_label
from lens.sites import HookSite, Site, expand_sites
from lens.store.format import (DTYPES, FORMAT_VERSION, MANIFEST, PARTIAL, SHARDS, parse_store_dtype,
                               compared_settings, load_manifest, sample_settings)
from lens.store.lock import LOCK
from lens.store.manifest import Manifest
from lens.store.reader import Store
from lens.store.writer import ShardWriter, describe_write_error, is_write_error, take_writer_lock
from lens.store.parts import parse_part
from lens.text.transforms import parse_transform
from lens.capturing.pipeline import Background
# what the store records of a capture lives in lens.capturing.manifest; library_versions stays importable here
from lens.capturing.manifest import _settings, _site_layout, library_versions, new_manifest  # noqa: F401
from lens.store.parts import part_windows
from lens.store.reader import open_store
from lens.capturing.pipeline import Feeder, gather, make_batch, write_pipelined
from lens.capturing.fidelity import measure, require_faithful
from lens.capturing.size import check_space as check_free, free_bytes, human_bytes, plan_size

log = logging.getLogger(__name__)
size_log = logging.getLogger("lens.capturing.capture.size")  # the size line; `lens capture` shows it on stderr


def _batches(win: Windows, start: int, stop: int, batch_size: int, pad_id: int, device):
    for lo in range(start, stop, batch_size):
        ids, mask = right_padded(win.input_ids[lo:min(lo + batch_size, stop)], pad_id)
        yield lo, torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def _gather(states: dict, mask: torch.Tensor) -> dict:
    """Drop padded positions: (batch, seq, d) -> (real tokens, d), in window order."""
    keep = mask.bool()
    where = {keep.device: keep}  # a model split across devices returns each layer on its own device
    return {k: v[where.setdefault(v.device, keep.to(v.device))] for k, v in states.items()}


def capture(model=None, corpus=_D.corpus, sites: Sequence[str] = _D.sites, layers=_D.layers, *,
            max_tokens: int | None = _D.max_tokens, out=None, seq_len: int = _D.seq_len,
            batch_size: int = _D.batch_size, dtype: str = _D.dtype, device: str | None = _D.device,
            store_device: str | None = _D.store_device, backend: str = _D.backend, resume: bool = False,
            progress: bool = True, transform=_D.transform, shard_tokens: int = _D.shard_tokens,
            remote: bool | str = _D.remote, part=None, pipeline: bool = _D.pipeline, positions=_D.positions,
            check_space: bool = _D.check_space, sample: str = _D.sample, sample_seed: int = _D.sample_seed,
            spec: CaptureSpec | None = None, allow_silently_wrong: bool = False) -> Store:
    """Capture ``sites`` x ``layers`` of ``model`` over ``corpus`` into a store.

    The capture settings are the fields of :class:`lens.capturing.spec.CaptureSpec` (their defaults and
    meaning are there): pass them as keywords, or as ``spec=`` (then ``model`` may be left out: the
    spec's model is loaded). ``model`` may be anything :func:`lens.load_model` takes. With ``out`` a
    folder, shards stream to disk and the returned store is memory-mapped from it; with ``out=None`` the
    store is held in memory. ``resume``: continue the capture in ``out`` after its last complete shard.
    ``part="i/N"`` captures only the i-th of N disjoint, deterministic runs of whole shards of the same
    plan (:mod:`lens.store.parts`); ``lens store merge`` joins the N parts into one store.

    Before anything is written, the first windows are re-run through the plain Hugging Face forward and
    compared with what the store would hold (:mod:`lens.capturing.fidelity`); the record is kept in the
    manifest (``fidelity``). Past the stated tolerance the capture raises :class:`lens.errors.SilentlyWrong`
    (exit 2) and leaves nothing behind, unless ``allow_silently_wrong``: then the store is kept, its record
    marked accepted.
    """
    given = dict(corpus=corpus, sites=sites, layers=layers, max_tokens=max_tokens, seq_len=seq_len,
                 batch_size=batch_size, dtype=dtype, device=device, store_device=store_device, backend=backend,
                 transform=transform, shard_tokens=shard_tokens, remote=remote, pipeline=pipeline,
                 positions=positions, check_space=check_space, sample=sample, sample_seed=sample_seed)
    if spec is None and model is None:
        raise TypeError("capture() needs a model (or spec=CaptureSpec(model=...))")
    spec = spec_from(spec, {"model": model, **given} if spec is None else given)
    return _run(model if model is not None else spec.model, spec, out=out, resume=resume, progress=progress,
                part=part, allow_silently_wrong=allow_silently_wrong)


def _run(model, spec: CaptureSpec, *, out, resume: bool, progress: bool, part,
         allow_silently_wrong: bool = False) -> Store:
    """Check ``spec`` (nothing is written before it passes), resolve it, and capture."""
    transform = parse_transform(spec.transform)
    model = load_model(model)
    if spec.device is not None:
        if is_dispatched(model.hf_model):
            raise LensInputError(f"{model.model_id} is split across devices by its device_map: capture it where it "
                                 f"is placed (no device={spec.device!r})")
        model.hf_model.to(parse_device(spec.device))
    store_device = parse_device(spec.store_device) if spec.store_device is not None else None
    dtype = parse_store_dtype(spec.dtype)
    positions = parse_positions(spec.positions)
    part = parse_part(part)
    if part is not None and out is None:
        raise LensInputError(f"--part {part.label} needs --out: the parts are store folders that "
                             "`lens store merge` joins")
    if spec.batch_size < 1:
        raise LensInputError(f"batch_size must be at least 1, got {spec.batch_size}")
    if spec.max_tokens is not None and spec.max_tokens < 1:
        raise LensInputError(f"max_tokens must be positive, got {spec.max_tokens}")
    check_seq_len(model, spec.seq_len)
    hooks = expand_sites(spec.sites, spec.layers, model.n_layers, model.site_map)
    # from here on every field is resolved: the corpus loaded, the transform, dtypes, positions and devices parsed
    spec = spec.replace(corpus=load_corpus(spec.corpus), transform=transform, store_device=store_device,
                        dtype=dtype, positions=positions, sample=parse_sample(spec.sample),
                        sample_seed=check_sample_seed(spec.sample_seed))
    settings = _settings(model, spec, hooks)
    if part is not None:  # only then, so a single capture's settings (and fingerprint) stay as they were
        settings["part"] = part.label
    if positions != ALL:  # likewise
        settings["positions"] = positions_label(positions)
    settings.update(sample_settings(spec.sample, spec.sample_seed))  # likewise: nothing for a "first" sample
    root = Path(out) if out is not None else None
    if root is None:
        return _capture(model, spec, hooks, settings, None, None, None, progress, allow_silently_wrong)
    if root.exists() and not root.is_dir():
        raise LensInputError(f"--out {root} exists and is not a folder")
    lock, created = take_writer_lock(root, "fix that and run the command again")
    try:
        existing = _check_target(root, resume, settings)
        return _capture(model, spec, hooks, settings, root, existing, part, progress, allow_silently_wrong)
    except BaseException:
        # only while holding the lock: a run refused by someone else's lock must not touch their folder
        if created and not (root / MANIFEST).exists():
            shutil.rmtree(root, ignore_errors=True)  # a refused or failed run leaves nothing behind
        raise
    finally:
        lock.release()


def check_seq_len(model: LoadedModel, seq_len: int) -> None:
    """Refuse a window length the model cannot take (before a division by it or an IndexError
    deep in the position embeddings)."""
    if not isinstance(seq_len, int) or seq_len < 4:
        raise LensInputError(f"seq_len must be an integer of at least 4, got {seq_len!r}")
    config = getattr(model.hf_model, "config", None)
    for name in ("n_positions", "max_position_embeddings"):
        limit = getattr(config, name, None)
        if isinstance(limit, int) and limit > 0:
            if seq_len > limit:
                raise LensInputError(f"seq_len {seq_len} is longer than {model.model_id} takes: expected at most "
                                     f"{limit} (its {name})")
            return


@dataclass(frozen=True)
class KeptWindows:
    """A plan's windows with the token table cut to the rows ``positions`` keeps: ``rows`` and
    ``window_offsets()`` count kept rows; ``input_ids`` are the whole windows the model runs on."""

    input_ids: list
    rows: dict
    offsets: np.ndarray
    seq_len: int

    @property
    def n_windows(self) -> int:
        return len(self.input_ids)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def window_offsets(self) -> np.ndarray:
        return self.offsets


def keep_positions(win: Windows, positions) -> tuple[KeptWindows, np.ndarray]:
    """``win`` cut to the rows ``positions`` keeps in each window (rows of the token table, in order)."""
    lengths = np.asarray([len(w) for w in win.input_ids], dtype=np.int64)
    window = np.asarray(win.rows["window"], dtype=np.int64)
    keep = keep_mask(np.asarray(win.rows["pos"], dtype=np.int64), lengths[window], positions)
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        raise LensInputError(f"--positions {positions_label(positions)} keeps no token: the {win.n_windows} windows "
                             f"have at most {int(lengths.max())} tokens")
    counts = np.bincount(window[kept], minlength=win.n_windows)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return KeptWindows(win.input_ids, {k: np.asarray(v)[kept] for k, v in win.rows.items()}, offsets,
                       win.seq_len), kept


def _capture(model, spec: CaptureSpec, hooks, settings, root, existing, part, progress,
             allow_silently_wrong: bool = False) -> Store:
    """Capture resolved ``spec`` (see :func:`_run`) into ``root`` (None: in memory); ``existing``: the
    manifest of the store being resumed."""
    corpus, seq_len, batch_size, dtype = spec.corpus, spec.seq_len, spec.batch_size, spec.dtype
    positions, pipeline, shard_windows = spec.positions, spec.pipeline, spec.shard_windows
    # the whole plan, even for a part: windows (and the token text's width) as a single capture cuts them
    planned = make_windows(corpus, model.tokenizer, seq_len=seq_len, max_tokens=spec.max_tokens,
                           is_causal=model.is_causal, transform=spec.transform, sample=spec.sample,
                           sample_seed=spec.sample_seed)
    all_ids, kept = planned.rows["token_id"], None
    win: Windows | KeptWindows = planned
    if positions != ALL:
        win, kept = keep_positions(planned, positions)
    offsets = win.window_offsets()
    w_start, w_end = (0, win.n_windows) if part is None else part_windows(part, win.n_windows, shard_windows)
    # the token text (one decode per distinct id) is needed only when the first shard is finished; the
    # text of every token of the plan sets the column's width, kept rows or not
    texts = Background(lambda: token_strings(model.tokenizer, all_ids) if kept is None
                       else token_strings(model.tokenizer, all_ids)[kept], "lens-token-text")
    if not pipeline:
        texts.result()
    engine = make_backend(spec.backend, model, hooks, **({"remote": spec.remote} if spec.backend == "nnsight" else {}))
    site_layers, layer_index = _site_layout(hooks)
    pad_id = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    run_device = model.device
    # the fidelity check, before the first byte: a resumed store keeps the record of the run that began it
    fidelity = None if existing else _fidelity(model, engine, win, w_start, w_end, batch_size, pad_id, run_device,
                                               spec, allow_silently_wrong)
    manifest = existing if existing is not None else new_manifest(model, spec, settings, site_layers, win, offsets,
                                                                   w_start, w_end, part, fidelity)
    delay = float(os.environ.get("LENS_DEBUG_BATCH_DELAY", "0") or 0)  # test aid: slow capture down
    bar = tqdm(total=int(offsets[w_end] - offsets[w_start]), unit="tok", desc=f"capture {model.model_id}", disable=not progress)

    if root is None:
        held = spec.store_device or str(run_device)
        parts, nonfinite = _capture_in_memory(engine, win, batch_size, pad_id, run_device, held, dtype, layer_index,
                                              site_layers, bar, pipeline, positions)
        bar.close()
        arrays = {site: torch.stack([torch.cat(parts[HookSite(Site(site), l).key]) for l in layers])
                  for site, layers in site_layers.items()}
        # no warning here: the store carries its counts (Store.nonfinite) and the studies that capture
        # in memory refuse non-finite layers themselves, in one line
        tokens = dict(win.rows, token=texts.result())
        return Store(manifest.with_(n_tokens=win.n_tokens, complete=True, nonfinite=nonfinite), tokens,
                     arrays=arrays, device=held)

    _size_check(manifest, root, offsets, w_start, w_end, shard_windows, texts, spec.check_space)
    writer = ShardWriter(root, manifest)
    try:
        writer.recover()
        writer.commit_manifest()
        done_windows = manifest.shards[-1].window_end if manifest.shards else w_start
        bar.update(int(offsets[done_windows] - offsets[w_start]))
        shards = [(s_lo, min(s_lo + shard_windows, w_end)) for s_lo in range(done_windows, w_end, shard_windows)]
        if pipeline:
            write_pipelined(engine, win, shards, batch_size, pad_id, run_device, writer, layer_index, dtype, texts,
                            bar, delay, positions=positions)
        else:
            _write_serial(engine, win, shards, batch_size, pad_id, run_device, writer, layer_index, texts, bar, delay,
                          positions)
        writer.complete()
    except OSError as exc:
        writer.abort()
        if not is_write_error(exc):
            raise
        raise StoreWriteError(describe_write_error(exc, root, writer.manifest)) from None
    finally:
        bar.close()
    _warn_nonfinite(writer.manifest)

    return open_store(root, device=spec.store_device)


def _write_serial(engine, win, shards, batch_size, pad_id, run_device, writer, layer_index, texts, bar, delay,
                  positions) -> None:
    """Each shard ``(s_lo, s_hi)`` of ``shards``, a batch at a time: forward, gather, write (no pipeline)."""
    offsets = win.window_offsets()
    for s_lo, s_hi in shards:
        writer.begin(s_lo, s_hi, int(offsets[s_hi] - offsets[s_lo]))
        for lo, ids, mask in _batches(win, s_lo, s_hi, batch_size, pad_id, run_device):
            states, _ = engine.run(ids, mask)
            if positions == ALL:
                got, n = _gather(states, mask), int(mask.sum())
            else:
                b = make_batch(win.input_ids, lo, min(lo + batch_size, s_hi), pad_id, run_device, False, positions)
                got, n = gather(states, b), b.n
            writer.add_batch(got, layer_index, n)
            bar.update(n)
            if delay:
                time.sleep(delay)
        sl = slice(int(offsets[s_lo]), int(offsets[s_hi]))
        writer.finish({**{k: v[sl] for k, v in win.rows.items()}, "token": texts.result()[sl]})

def _capture_in_memory(engine, win, batch_size, pad_id, run_device, held, dtype, layer_index, site_layers, bar,
                       pipeline, positions=ALL) -> tuple[dict, dict]:
    """hook key -> list of (tokens, width) tensors on ``held``, in window order, and the non-finite values per
    site and layer (``site_layers``' layout; counted on the device until the end: no synchronisation per batch)."""
    parts: dict = {k: [] for k in layer_index}
    bad: dict = {k: 0 for k in layer_index}
    feeder = Feeder(win.input_ids, 0, win.n_windows, batch_size, pad_id, run_device, depth=3 if pipeline else 1,
                    positions=positions)
    try:
        for batch in feeder:
            states, _ = engine.run(batch.ids, batch.mask)
            for k, v in gather(states, batch).items():
                v = v.to(device=held, dtype=DTYPES[dtype][0])
                bad[k] = bad[k] + (v.numel() - torch.isfinite(v).sum())
                parts[k].append(v)
            bar.update(batch.n)
    finally:
        feeder.close()
    nonfinite = {site: [0] * len(layers) for site, layers in site_layers.items()}
    for k, count in bad.items():
        site, idx = layer_index[k]
        nonfinite[site][idx] += int(count)
    return parts, nonfinite


def _fidelity(model, engine, win, w_start, w_end, batch_size, pad_id, run_device, spec: CaptureSpec,
              allow: bool) -> dict:
    """The capture's fidelity record (JSON), measured on its first windows; :class:`SilentlyWrong` past the
    tolerance unless ``allow``."""
    remote = spec.backend == "nnsight" and bool(spec.remote) and spec.remote != "local"
    record = measure(model, engine, win, w_start, w_end, batch_size, pad_id, run_device, spec.backend, remote=remote)
    return require_faithful(record, model.model_id, allow).to_dict()


def _size_check(manifest, root, offsets, w_start, w_end, shard_windows, texts, check_space) -> None:
    """Log the bytes the store will take and refuse a capture its filesystem cannot hold."""
    plan = [(lo, min(lo + shard_windows, w_end), int(offsets[min(lo + shard_windows, w_end)] - offsets[lo]))
            for lo in range(w_start, w_end, shard_windows)]
    width = int(texts.result().dtype.itemsize // 4)  # the token text column's characters (numpy '<U' is 4 B each)
    size = plan_size(manifest, plan, len(manifest.shards), width)
    free = check_free(size, root) if check_space else free_bytes(root)
    size_log.info("capture into %s: %s; %s free there%s", root, size.describe(), human_bytes(free),
                  "" if check_space or free >= size.need else " (not enough: --no-space-check given)")


def _warn_nonfinite(manifest: Manifest) -> None:
    bad = [(site, layer, c) for site, counts in (manifest.nonfinite or {}).items()
           for layer, c in zip(manifest.sites[site], counts) if c]
    if bad:
        where = ", ".join(f"{s}{'' if l is None else f' layer {l}'}: {c}" for s, l, c in bad[:6])
        log.warning("captured non-finite values (NaN or inf) at %s%s; studies refuse these layers",
                    where, f" and {len(bad) - 6} more" if len(bad) > 6 else "")


def _uncommitted_leftovers(root: Path) -> list[Path] | None:
    """What a capture that died before its first manifest commit leaves (an empty ``shards/`` or one
    holding only ``*.partial`` folders, a ``manifest.json.tmp``): nothing in it was ever committed.
    ``None`` if the folder holds anything else."""
    out = []
    for p in root.iterdir():
        if p.name == LOCK:
            continue
        if p.name == MANIFEST + ".tmp" and p.is_file():
            out.append(p)
        elif p.name == SHARDS and p.is_dir() and not p.is_symlink() and all(
                q.name.endswith(PARTIAL) for q in p.iterdir()):
            out.append(p)
        else:
            return None
    return out


def _setting(key: str, value) -> str:
    """A setting as a refusal shows it: ``positions`` absent (every position) is ``'all'``, as --positions names it."""
    return repr(ALL if key == "positions" and value is None else value)


def _check_target(root: Path, resume: bool, settings: dict) -> Manifest | None:
    """Refuse to overwrite anything; on resume, check the store was made with the same settings.
    Called with the folder's writer lock held."""
    has_manifest = (root / MANIFEST).exists()
    if not has_manifest:
        leftovers = _uncommitted_leftovers(root)
        if leftovers is None:
            if (root / SHARDS).is_dir():
                raise LensInputError(
                    f"--out {root} has shards but no manifest.json: its manifest was lost, so its shards cannot be "
                    "trusted; delete the folder (or choose another --out) and capture again")
            raise LensInputError(f"--out {root} is a non-empty folder that is not a store: choose another folder")
        if leftovers:
            log.warning("%s: a capture stopped before committing anything here; starting afresh", root)
            for p in leftovers:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        return None
    manifest = load_manifest(root)
    if manifest.format_version < FORMAT_VERSION:
        raise LensInputError(
            f"{root} is a format {manifest.format_version} store, which this version reads but does not extend: "
            "capture into a new folder (without --resume) to get a format 2 store")
    if not resume:
        raise LensInputError(
            f"a store already exists at {root} ({manifest.n_tokens} tokens of {manifest.model_id}); "
            "pass --resume to continue it or choose another --out")
    # a store from before the settings named them: its model ran in the card's dtype, with eager attention
    old = {"model_dtype": manifest.model.get("dtype", "float32"), "attn": "eager", **(manifest.settings or {})}
    # a store that records no sample holds the first tokens
    old, new = compared_settings(old), compared_settings(settings)
    diff = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if diff:
        shown = "; ".join(f"{k}: store has {_setting(k, old.get(k))}, this run has {_setting(k, new.get(k))}"
                          for k in diff[:4])
        hint = (f" (resume it with --sample {old['sample']}"
                f"{'' if old.get('sample_seed') is None else ' --sample-seed ' + str(old['sample_seed'])})"
                if {"sample", "sample_seed"} & set(diff) else "")
        raise LensInputError(f"cannot resume {root}: it was captured with other settings ({shown}){hint}")
    return manifest  # the value the resumed capture's writer derives the next ones from
