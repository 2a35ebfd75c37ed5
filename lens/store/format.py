"""The activation store's on-disk format (also documented in docs/store.md).

```
STORE/
  manifest.json              # written atomically after each complete shard
  shards/00000/              # one directory per shard; appears only when complete
    resid_post.npy           # (n_layers_of_site, n_tokens_in_shard, d_model), stored dtype
    attn_out.npy ...
    tokens.doc.npy ...       # token table columns (int64 / bool / unicode), one row per token
  shards/00001.partial/      # a shard being written; never listed in the manifest
```

bfloat16 has no numpy dtype, so bf16 activations are stored as ``uint16`` bit patterns
(``manifest["storage_dtype"] == "bfloat16-as-uint16"``); widen with
``(a.astype(np.uint32) << 16).view(np.float32)``. Every file carries a CRC-32 in the manifest.
Nothing is ever read with pickle (``np.load(..., allow_pickle=False)``).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from lens.errors import LensInputError, StoreCorruptError

FORMAT = "lens-activation-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARDS = "shards"
PARTIAL = ".partial"
TOKEN_COLUMNS = ("doc", "window", "pos", "doc_pos", "token_id", "next_token_id", "special", "token")

DTYPES = {
    "float32": (torch.float32, np.float32, "float32"),
    "float16": (torch.float16, np.float16, "float16"),
    "bfloat16": (torch.bfloat16, np.uint16, "bfloat16-as-uint16"),
}


def parse_store_dtype(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    name = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}.get(name, name)
    if name not in DTYPES:
        raise LensInputError(f"unknown store dtype {dtype!r}: expected float32, float16 or bfloat16")
    return name


def to_storage(x: torch.Tensor, dtype: str) -> np.ndarray:
    """A CPU numpy array in the store's storage dtype."""
    torch_dtype, _, _ = DTYPES[dtype]
    x = x.detach().to(device="cpu", dtype=torch_dtype)
    if dtype == "bfloat16":
        return x.view(torch.int16).numpy().view(np.uint16)
    return x.numpy()


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
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_manifest(root: Path) -> dict:
    path = Path(root) / MANIFEST
    if not path.is_file():
        if Path(root).is_dir() and (Path(root) / SHARDS).is_dir():
            raise LensInputError(f"{root} has shards but no manifest.json: the store is incomplete")
        raise LensInputError(f"{root} is not an activation store: expected {MANIFEST} in it")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise StoreCorruptError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if manifest.get("format") != FORMAT:
        raise LensInputError(f"{root} is not an activation store: manifest format is {manifest.get('format')!r}")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise LensInputError(
            f"{root} was written by a newer format version {manifest['format_version']} (this reads {FORMAT_VERSION})")
    return manifest
