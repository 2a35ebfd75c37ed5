"""The activation store's on-disk format (also documented in docs/store.md).

```
STORE/
  manifest.json              # sealed with a SHA-256 of its content; replaced atomically after each shard
  writer.lock                # present while a capture writes the folder (see lens.store.lock)
  shards/00000/              # one directory per shard; renamed into place only when complete
    resid_post.npy           # (n_layers_of_site, n_tokens_in_shard, d_model), stored dtype
    attn_out.npy ...
    tokens.doc.npy ...       # token table columns (int64 / bool / unicode), one row per token
    stats.resid_post.npy ... # float64 sums of the shard's rows per layer (lens.store.stats), in "stats"
  shards/00001.partial/      # a shard being written; never listed in the manifest
```

``positions`` (manifest): which positions of each window the store keeps — ``all`` (every token),
or ``last`` / ``every:K`` / ``first:K`` / ``0,5,-1`` for a capture made with ``--positions``
(:mod:`lens.store.positions`); the token table then holds only those rows, its ``pos`` column the position
of each. Stores written before the field existed keep every position.

``sample`` (manifest): which tokens of a corpus larger than ``max_tokens`` the store holds — ``spread``
(whole windows drawn from every document in turn, seeded by ``sample_seed``) or ``first`` (the documents
in order until ``max_tokens``; :func:`lens.text.corpora.make_windows`). Stores written before the field
existed hold the first tokens (:func:`store_sample`). The capture's ``settings`` record a spread sample
(``sample``, ``sample_seed``) and nothing for a first one, so resuming, ``--part`` and ``lens store merge``
refuse a store of the other sample (:func:`compared_settings`).

bfloat16 has no numpy dtype, so bf16 activations are stored as ``uint16`` bit patterns
(``manifest["storage_dtype"] == "bfloat16-as-uint16"``); widen with
``(a.astype(np.uint32) << 16).view(np.float32)``.

Integrity (format 2): every byte a reader interprets is covered by a checksum recorded in the manifest
— the ``.npy`` header of each activation file (``header_crc32``), each layer block of it
(``layer_crc32``, so reading one layer verifies only what it reads) and each token column as a whole
(``crc32``) — and the manifest carries ``manifest_sha256`` over its own canonical JSON, so an edit
that leaves valid JSON is caught too. Nothing is ever read with pickle
(``np.load(..., allow_pickle=False)``). Format 1 stores (no manifest checksum, no header checksums)
stay readable: their headers are checked against the manifest instead.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from lens.errors import LensInputError, StoreCorruptError
from lens.store.schema import CHECKSUM_KEY, DTYPES, TOKEN_COLUMNS, storage_np_dtype, validate_manifest  # noqa: F401
from lens.store import fsio
from lens.store.faults import fault_point
from lens.store.checksum import crc32
from lens.store.nonfinite import count_stored
from lens.store.layout import MANIFEST, SHARDS, is_store  # noqa: F401 (the store's names, once)
from lens.store.manifest import Manifest, manifest_digest  # noqa: F401 (the digest is the manifest's own)

FORMAT = "lens-activation-store"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
PARTIAL = ".partial"


def parse_store_dtype(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    name = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}.get(name, name)
    if name not in DTYPES:
        raise LensInputError(f"unknown store dtype {dtype!r}: expected float32, float16 or bfloat16")
    return name


def site_width(manifest: Mapping, site: str) -> int:
    """Columns of a site's states: d_model, except sites listed in ``widths`` (MoE router logits have
    one column per expert); ``manifest``: its JSON, or a :class:`Manifest` (whose :meth:`Manifest.width` says
    the same)."""
    return int((manifest.get("widths") or {}).get(site, manifest["d_model"]))


def to_storage(x: torch.Tensor, dtype: str) -> np.ndarray:
    """A CPU numpy array in the store's storage dtype."""
    return to_storage_counted(x, dtype)[0]


def count_nonfinite(x: torch.Tensor) -> int:
    """How many entries of ``x`` are NaN or ±inf. NaN and inf survive a sum (inf − inf is NaN), so a
    finite sum proves there are none at the cost of one reduction (``isfinite`` of every entry costs
    ~20× as much here); only a non-finite sum — a bad entry, or finite ones overflowing — is counted."""
    if not x.is_floating_point() or bool(torch.isfinite(x.sum())):
        return 0
    return int(x.numel() - torch.isfinite(x).sum())


def count_nonfinite_stored(block: np.ndarray, dtype: str) -> int:
    """How many values of a block in the storage dtype are NaN or ±inf (bfloat16 as uint16 bit patterns:
    an exponent of all ones). A float block whose float64 sum is finite has none (float32 values cannot
    overflow a float64 sum), so a clean block costs one pass. The storage dtypes' bit patterns are counted in
    one compiled pass (:mod:`lens.store.nonfinite`)."""
    block = np.asarray(block)
    counted = count_stored(block, dtype)
    if counted is not None:
        return counted
    if dtype == "bfloat16":  # uint16 bit patterns: exponent all ones is inf or NaN
        return int(np.count_nonzero((block & 0x7F80) == 0x7F80))
    if block.size == 0:
        return 0
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf in the sum is the point, not a warning
        if np.isfinite(np.add.reduce(block, axis=None, dtype=np.float64)):
            return 0
    return int(block.size - np.count_nonzero(np.isfinite(block)))


def to_storage_counted(x: torch.Tensor, dtype: str) -> tuple[np.ndarray, int]:
    """``to_storage`` and the number of non-finite values in what is stored (counted after the cast:
    a finite float32 state can overflow to inf in float16)."""
    torch_dtype, _, _ = DTYPES[dtype]
    x = x.detach().to(device="cpu", dtype=torch_dtype)
    nonfinite = count_nonfinite(x)
    if dtype == "bfloat16":
        return x.view(torch.int16).numpy().view(np.uint16), nonfinite
    return x.numpy(), nonfinite


def from_storage(a: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    if dtype == "bfloat16":
        return t.view(torch.bfloat16)
    return t


def crc32_file(path: Path, chunk: int = 1 << 24) -> str:
    crc = 0
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            crc = crc32(block, crc)
    return f"{crc:08x}"


def fsync_dir(path: Path) -> None:
    fsio.fsync_dir(path)


def fsync_file(fh) -> None:
    fsio.fsync_file(fh)


def settings_fingerprint(settings: dict) -> str:
    """Short hash of a capture's settings (the manifest's ``fingerprint``)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new file, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    fsio.unlink(tmp)  # a leftover of an interrupted write, or a planted link: removed, never written through
    with fsio.open_new_file(tmp, text=True) as fh:
        json.dump(data, fh, indent=1)
        fsio.fsync_file(fh)
    fault_point("manifest.tmp-written")
    fsio.rename(tmp, path)
    fault_point("manifest.replaced")
    fsio.fsync_dir(path.parent)


def write_manifest(root: Path, manifest: Manifest) -> Manifest:
    """Commit ``manifest``: sealed with its checksum (:meth:`Manifest.sealed`), ``root/manifest.json`` replaced
    atomically; returns the sealed value (what the file now holds)."""
    sealed = manifest.sealed(FORMAT_VERSION)
    write_json_atomic(Path(root) / MANIFEST, sealed.to_dict())
    return sealed


def commit_manifest(root: Path, manifest: dict) -> None:
    """Seal the JSON object ``manifest`` in place with its checksum and replace ``root/manifest.json`` atomically:
    for JSON edited by hand (tests, repairs); the writers commit values (:func:`write_manifest`)."""
    manifest["format_version"] = FORMAT_VERSION
    manifest[CHECKSUM_KEY] = manifest_digest(manifest)
    write_json_atomic(Path(root) / MANIFEST, manifest)


def enclosing_store(path) -> Path | None:
    """The activation store folder that ``path`` is or lies inside (links resolved), or None: the
    nearest folder on the way up that holds ``shards/`` and a ``manifest.json`` whose ``format`` is a
    store's (any other project's manifest.json beside a shards folder is not one). A store's folder holds
    only what its writer puts there (and ``--resume`` cleans its ``shards/``), so nothing else may be
    written into one."""
    at = Path(path).resolve()
    for folder in (at, *at.parents):
        if is_store(folder) and (folder / SHARDS).is_dir() and _names_store_format(folder / MANIFEST):
            return folder
    return None


def _names_store_format(path: Path) -> bool:
    """Whether the manifest file ``path`` says it is a lens store's (a damaged or very long one too: the
    format is written first)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except OSError:
        return False
    try:
        return json.loads(head.decode("utf-8")).get("format") == FORMAT
    except (UnicodeDecodeError, ValueError, AttributeError):
        return FORMAT.encode() in head[:4096]


def read_manifest(root: Path) -> dict:
    """The manifest of the store at ``root`` as a fresh JSON dict (to show or edit the JSON itself), refused
    unless its schema and checksum hold; readers and writers take :func:`load_manifest`'s value instead."""
    return load_manifest(root).to_dict()


def load_manifest(root: Path) -> "Manifest":
    """The manifest of the store at ``root`` as a frozen :class:`lens.store.manifest.Manifest`, parsed and
    checked once: refused unless its schema and checksum hold.

    Raises :class:`LensInputError` when ``root`` is not a store (or a newer one) and
    :class:`StoreCorruptError` naming the file and the problem when it is damaged."""
    root = Path(root)
    path = root / MANIFEST
    if not path.exists():
        if root.is_dir() and (root / SHARDS).is_dir():
            raise LensInputError(f"{root} has shards but no manifest.json: the store is incomplete or its "
                                 "manifest was lost (capture it again)")
        raise LensInputError(f"{root} is not an activation store: expected {MANIFEST} in it")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StoreCorruptError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StoreCorruptError(f"{path}: is not UTF-8 text (byte {exc.start} is invalid): the manifest is "
                                "damaged") from None
    except json.JSONDecodeError as exc:
        raise StoreCorruptError(f"{path}: is not valid JSON ({exc.msg} at line {exc.lineno}): the manifest is "
                                "damaged or truncated") from None
    except RecursionError:
        raise StoreCorruptError(f"{path}: is not a manifest (JSON nested too deeply)") from None
    if not isinstance(manifest, dict):
        kind = {list: "an array", type(None): "null", str: "a string", bool: "a boolean"}.get(type(manifest), "a number")
        raise StoreCorruptError(f"{path}: expected a JSON object, found {kind}")
    if manifest.get("format") != FORMAT:
        raise LensInputError(f"{root} is not an activation store: {MANIFEST} has format "
                             f"{manifest.get('format')!r}, expected {FORMAT!r}")
    version = manifest.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise LensInputError(f"{root} was written by a newer format version {version} (this version reads "
                             f"{', '.join(map(str, READABLE_VERSIONS))}): upgrade lens-workbench")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise StoreCorruptError(f"{path}: format_version is {version!r}, expected one of "
                                f"{', '.join(map(str, READABLE_VERSIONS))}")
    value = Manifest.from_dict(manifest, str(path))  # the schema's checks, once
    if version >= 2:
        got = manifest_digest(manifest)
        if got != manifest[CHECKSUM_KEY]:
            raise StoreCorruptError(
                f"{path}: checksum mismatch (content sha256 {got[:12]}..., recorded {manifest[CHECKSUM_KEY][:12]}...): "
                "the manifest was edited or damaged after it was written")
    return value


def sample_settings(sample: str, seed: int) -> dict:
    """What a capture's settings record of its sample: nothing for ``first`` (so its settings and their
    fingerprint stay those of a store from before samples were recorded), else ``sample`` and ``sample_seed``."""
    return {} if sample == "first" else {"sample": sample, "sample_seed": int(seed)}


def compared_settings(settings: dict) -> dict:
    """``settings`` as compared with another capture's (resuming, merging parts): a sample they do not
    record is ``first``."""
    return {"sample": "first", **settings}


def store_sample(manifest: dict) -> tuple[str, int | None]:
    """(sample, seed) of the tokens a store holds: ``("spread", seed)`` or ``("first", None)``; a store
    written before samples were recorded holds the first tokens of its corpus."""
    settings = manifest.get("settings") or {}
    sample = manifest.get("sample", settings.get("sample", "first"))
    seed = manifest.get("sample_seed", settings.get("sample_seed"))
    return str(sample), (None if sample == "first" or seed is None else int(seed))


def sample_label(manifest: dict) -> str:
    """``spread (seed 0)`` or ``first``: :func:`store_sample` in words."""
    sample, seed = store_sample(manifest)
    return sample if seed is None else f"{sample} (seed {seed})"
