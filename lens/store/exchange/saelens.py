"""A store as a SAELens activation cache, and such a cache as an import source.

The layout is the one SAELens' ``CacheActivationsRunner`` writes (sae_lens/cache_activations_runner.py:
``__init__`` builds the features, ``_create_shard`` and ``run`` the shards, ``_consolidate_shards`` the saved
dataset): a Hugging Face ``datasets`` dataset saved with ``save_to_disk`` whose features are the hook's column,
``Array2D(shape=(context_size, d_in), dtype)``, and ``token_ids``, ``Sequence(Value("int32"), length=context_size)``;
its files ``dataset_info.json``, ``state.json`` (with the dataset's fingerprint) and ``data-0000i-of-0000N.arrow``,
one per buffer, moved out of ``.tmp_shards/shard_0000i/`` as the runner moves them. SAELens trains from it with
``use_cached_activations=True, cached_activations_path=FOLDER, hook_name=..., context_size=..., d_in=...``
(``ActivationsStore.load_cached_activation_dataset`` checks the column's shape against both).

The runner caches one hook per dataset; an export writes one dataset per site and layer, ``OUT/<site>.<layer>/``
(``OUT/resid_post.6/``, column ``blocks.6.hook_resid_post``), and ``OUT/lens_source.json`` naming the store.

Windows become rows: a row is one window of the store, ``context_size`` its ``seq_len``. A window shorter than
that (a document's short last window) is left out — Array2D rows have one length, and padding would hand the SAE
states of tokens the model never saw; the count left out is in ``lens_source.json``. Stores that keep only some
positions of each window (``--positions``) have no whole windows and are refused. float32 and float16 are
kept; bfloat16 is written as float32, widened exactly (Arrow has no bfloat16; SAELens converts the column to its
configured dtype when it loads it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from lens.errors import LensInputError, StoreCorruptError
from lens.store.exchange.importer import Piece, Source, window_tokens, windows_per_shard
from lens.store.exchange.lazy import value_dtype
from lens.store.exchange.safetensors_io import source_record
from lens.store.exchange.selection import BlockReader, select, widen
from lens.store.exchange.staging import staged
from lens.store.shardfiles import ShardFiles

BUFFER_BYTES = 64 << 20  # activations per saved shard (one buffer of the runner): memory holds about two
SOURCE_FILE = "lens_source.json"


class _quiet_datasets:
    """``datasets``' own progress bars off while an export writes (ours is the one the caller sees)."""

    def __enter__(self):
        from datasets.utils import logging as dlog  # lazy: import cost (datasets 1.1 s, which only a SAELens export or import pays)

        self.was = dlog.is_progress_bar_enabled()
        dlog.disable_progress_bar()

    def __exit__(self, *exc):
        from datasets.utils import logging as dlog  # lazy: import cost (datasets 1.1 s, which only a SAELens export or import pays)

        if self.was:
            dlog.enable_progress_bar()


def _features(hook: str, context_size: int, d_in: int, dtype: str):
    from datasets import Array2D, Features, Sequence, Value  # lazy: import cost (datasets 1.1 s, which only a SAELens export or import pays)

    return Features({hook: Array2D(shape=(context_size, d_in), dtype=dtype),
                     "token_ids": Sequence(Value(dtype="int32"), length=context_size)})


def _consolidate(source_dir: Path, output_dir: Path):
    """``CacheActivationsRunner._consolidate_shards`` (move, not copy): the shards' arrow files renamed into
    ``output_dir``, the first shard's ``dataset_info.json``, a ``state.json`` listing them with the dataset's
    fingerprint."""
    from datasets import Dataset  # lazy: import cost (datasets 1.1 s, which only a SAELens export or import pays)
    from datasets.fingerprint import generate_fingerprint  # lazy: import cost (datasets 1.1 s, which only a SAELens export or import pays)

    shutil.move(source_dir / "shard_00000" / "dataset_info.json", output_dir / "dataset_info.json")
    arrow_files, count = [], 0
    total = len(list(source_dir.iterdir()))
    for shard_dir in sorted(source_dir.iterdir()):
        if not shard_dir.name.startswith("shard_"):
            continue
        state = json.loads((shard_dir / "state.json").read_text())
        for data_file in state["_data_files"]:
            new_name = f"data-{count:05d}-of-{total:05d}.arrow"
            shutil.move(shard_dir / data_file["filename"], output_dir / new_name)
            arrow_files.append({"filename": new_name})
            count += 1
    state = {"_data_files": arrow_files, "_fingerprint": None, "_format_columns": None, "_format_kwargs": {},
             "_format_type": None, "_output_all_columns": False, "_split": None}
    (output_dir / "state.json").write_text(json.dumps(state, indent=2))
    ds = Dataset.load_from_disk(str(output_dir))
    state["_fingerprint"] = generate_fingerprint(ds)
    del ds
    (output_dir / "state.json").write_text(json.dumps(state, indent=2))
    shutil.rmtree(source_dir)


def whole_windows(tokens: dict, context_size: int) -> tuple[np.ndarray, int]:
    """The first row of every window of exactly ``context_size`` tokens, and how many shorter ones there are."""
    window = np.asarray(tokens["window"])
    if not len(window):
        return np.zeros(0, np.int64), 0
    starts = np.flatnonzero(np.r_[True, window[1:] != window[:-1]])
    lengths = np.diff(np.r_[starts, len(window)])
    return starts[lengths == context_size].astype(np.int64), int((lengths < context_size).sum())


def export_saelens(store, out, sites=None, layers=None, hook_name=None, progress: bool = False) -> Path:
    """Write ``store`` as SAELens activation caches, one per site and layer, into the new folder ``out``;
    ``hook_name(site, layer)`` names each column (TransformerLens' hook name)."""
    from datasets import Dataset, load_from_disk  # lazy: import cost (datasets 1.1 s, which only a SAELens export or import pays)

    m = store.manifest
    if (m.positions or "all") != "all":
        raise LensInputError(f"store {store.root} keeps only some positions of each window ({m.positions}): a "
                             "SAELens cache holds whole windows (capture without --positions)")
    blocks = select(m, sites, layers)
    ctx = int((m.settings or {}).get("seq_len") or 0)
    starts, short = whole_windows(store.tokens, ctx)
    if not len(starts):
        raise LensInputError(f"store {store.root} has no window of its full length {ctx}: nothing to cache")
    out_dtype = value_dtype(m.dtype)
    reader = BlockReader(ShardFiles(store.root, m, verify=True), m)  # each block read once, its CRC checked
    ids = np.asarray(store.tokens["token_id"])
    row_bytes = ctx * max(m.width(b.site) for b in blocks) * out_dtype.itemsize
    per = max(1, BUFFER_BYTES // max(1, row_bytes))
    need = sum(len(starts) * ctx * (m.width(b.site) * out_dtype.itemsize + 4) for b in blocks) + (1 << 20)
    bar = tqdm(total=len(starts) * len(blocks), unit="row", desc=f"export {store.root} to saelens", disable=not progress)
    record = {**source_record(store, blocks), "context_size": ctx, "rows": int(len(starts)),
              "short_windows_left_out": short, "dtype": str(out_dtype),
              "datasets": {b.key: hook_name(b.site, b.layer) for b in blocks}}
    try:
        with staged(out, need) as tmp, _quiet_datasets():
            for b in blocks:
                hook = hook_name(b.site, b.layer)
                feats = _features(hook, ctx, m.width(b.site), str(out_dtype))
                folder = tmp / b.key
                shards = folder / ".tmp_shards"
                shards.mkdir(parents=True)
                for i, lo in enumerate(range(0, len(starts), per)):
                    rows = starts[lo:lo + per]
                    acts = _rows(reader, m, b, rows, ctx)
                    tok = ids[rows[:, None] + np.arange(ctx)].astype(np.int32)
                    Dataset.from_dict({hook: acts, "token_ids": tok}, features=feats).save_to_disk(
                        str(shards / f"shard_{i:05d}"), num_shards=1)
                    bar.update(len(rows))
                _consolidate(shards, folder)
                # read back: the saved dataset, through datasets, equals the store
                ds = load_from_disk(str(folder)).with_format("numpy")
                if ds.num_rows != len(starts) or ds.features != feats:
                    raise StoreCorruptError(f"{folder}: reads back {ds.num_rows} rows / other features than written")
                for lo in range(0, len(starts), per):
                    rows = starts[lo:lo + per]
                    got = ds[lo:lo + len(rows)]
                    if not (np.array_equal(got[hook], _rows(reader, m, b, rows, ctx)) and
                            np.array_equal(got["token_ids"], ids[rows[:, None] + np.arange(ctx)])):
                        raise StoreCorruptError(f"{folder}: rows {lo}.. read back other values than the store holds")
            (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=1))
    finally:
        bar.close()
    return Path(out)


def _rows(reader, m, b, starts: np.ndarray, ctx: int) -> np.ndarray:
    """(rows, ctx, width) states of the windows starting at token rows ``starts``, in the export's dtype."""
    if not len(starts):
        return np.zeros((0, ctx, m.width(b.site)), value_dtype(m.dtype))
    lo, hi = int(starts[0]), int(starts[-1]) + ctx
    span = widen(reader.rows(b, lo, hi), m.dtype)
    return span[(starts - lo)[:, None] + np.arange(ctx)]


# --------------------------------------------------------------------------- a cache as an import source
def _datasets(path: Path) -> list[Path]:
    if (path / "state.json").is_file():
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and (p / "state.json").is_file()) if path.is_dir() else []
    if not found:
        raise LensInputError(f"{path}: not a SAELens activation cache (no state.json / dataset_info.json of a saved "
                             "Hugging Face dataset in it or in its folders)")
    return found


def _one_dataset(folder: Path, card: dict, site_of_hook) -> dict:
    """One saved SAELens dataset, checked (token ids, one activation column of ``card``'s width, a dtype a
    store keeps): its path, the dataset, hook, site, layer, context size, dtype, rows and fingerprint."""
    from datasets import Array2D, load_from_disk  # lazy: import cost (datasets 1.1 s, which only a SAELens export or import pays)

    try:
        ds = load_from_disk(str(folder))
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for a damaged folder
        raise LensInputError(f"{folder}: not a readable saved dataset ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]})") from None
    cols = ds.column_names
    hooks = [c for c in cols if isinstance(ds.features[c], Array2D)]
    if "token_ids" not in cols:
        raise LensInputError(f"{folder}: the SAELens cache has no token_ids column (columns: {', '.join(cols)}): "
                             "a store needs the token ids (cache it with a SAELens that writes them)")
    if len(hooks) != 1:
        raise LensInputError(f"{folder}: expected one activation column (Array2D) beside token_ids, found "
                             f"{len(hooks)} ({', '.join(cols)})")
    hook = hooks[0]
    ctx, d_in = ds.features[hook].shape
    if d_in != card["d_model"]:
        raise LensInputError(f"{folder}: a cache of another model: its {hook} has d_in {d_in}, {card['model_id']} "
                             f"has d_model {card['d_model']}")
    site, layer = site_of_hook(hook)
    dtype = ds.features[hook].dtype
    if dtype not in ("float32", "float16"):
        raise LensInputError(f"{folder}: activations of dtype {dtype}: a store keeps float32, float16 or bfloat16")
    return {"path": folder, "ds": ds.with_format("numpy"), "hook": hook, "site": site, "layer": layer,
            "ctx": ctx, "dtype": dtype, "rows": ds.num_rows,
            "fingerprint": json.loads((folder / "state.json").read_text()).get("_fingerprint")}


def read_saelens(src, card: dict, site_of_hook) -> Source:
    """A SAELens cache (one saved dataset, or a folder of them as ``lens store export --to saelens`` writes) as an
    import :class:`Source` for the model of ``card``; ``site_of_hook(name) -> (site, layer)``."""
    src = Path(src)
    if not src.exists():
        raise LensInputError(f"{src}: not found (expected a SAELens activation cache folder)")
    sets = [_one_dataset(folder, card, site_of_hook) for folder in _datasets(src)]
    first = sets[0]
    for s in sets[1:]:
        if (s["ctx"], s["rows"], s["dtype"]) != (first["ctx"], first["rows"], first["dtype"]):
            raise LensInputError(f"{s['path']}: its rows, context size or dtype differ from {first['path']}'s")
    sites: dict = {}
    order = {}
    for s in sorted(sets, key=lambda s: (s["site"], -1 if s["layer"] is None else s["layer"])):
        if s["layer"] in sites.get(s["site"], []):
            raise LensInputError(f"{s['path']}: {s['hook']} is given twice")
        sites.setdefault(s["site"], []).append(s["layer"])
        order[(s["site"], s["layer"])] = s
    ctx, n_rows, dtype = first["ctx"], first["rows"], first["dtype"]
    record = {"from": "saelens", "path": str(src.resolve()), "context_size": ctx, "rows": n_rows, "dtype": dtype,
              "datasets": {str(s["path"].resolve()): s["hook"] for s in sets},
              "fingerprint": "+".join(str(s["fingerprint"]) for s in sets)}

    def read(lo: int, hi: int) -> tuple[np.ndarray, dict]:
        ids, out = None, {}
        for site, layers in sites.items():
            per_layer = []
            for l in layers:
                s = order[(site, l)]
                got = s["ds"][lo:hi]
                if ids is None:
                    ids = np.asarray(got["token_ids"], dtype=np.int64)
                elif not np.array_equal(ids, got["token_ids"]):
                    raise LensInputError(f"{s['path']}: its token_ids differ from {first['path']}'s at rows {lo}..{hi}: "
                                         "not caches of the same text")
                per_layer.append(np.asarray(got[s["hook"]]).reshape(-1, card["d_model"]))
            out[site] = np.stack(per_layer).astype(dtype, copy=False)
        return ids, out

    def probes(k: int = 2):
        ids, states = read(0, min(k, n_rows))
        return [(ids[j], {s: a[:, j * ctx:(j + 1) * ctx] for s, a in states.items()}) for j in range(len(ids))]

    def pieces(shard_tokens: int, special):
        per = windows_per_shard(shard_tokens, ctx)
        for w0 in range(0, n_rows, per):
            w1 = min(w0 + per, n_rows)

            def chunks(w0=w0, w1=w1):
                step = max(1, BUFFER_BYTES // (ctx * card["d_model"] * 4 * max(1, len(sets))))
                for lo in range(w0, w1, step):
                    states = read(lo, min(lo + step, w1))[1]
                    yield (lo - w0) * ctx, {(s, k): a[k] for s, a in states.items() for k in range(a.shape[0])}

            yield Piece(w0, w1, (w1 - w0) * ctx,
                        tokens=lambda w0=w0, w1=w1: window_tokens(list(read_ids(w0, w1)), w0, special), chunks=chunks)

    def read_ids(lo, hi):
        return np.asarray(first["ds"][lo:hi]["token_ids"], dtype=np.int64)

    return Source(sites=sites, dtype=dtype, n_windows=n_rows, n_tokens=n_rows * ctx, seq_len=ctx, record=record,
                  probes=probes, pieces=pieces)


__all__ = ["export_saelens", "read_saelens", "whole_windows", "SOURCE_FILE"]
