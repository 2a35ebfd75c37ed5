"""Where the workbench keeps derived files (dequantised models). Override with LENS_CACHE_DIR."""

from __future__ import annotations

import os
from pathlib import Path

from lens.errors import LensInputError


def cache_dir() -> Path:
    root = os.environ.get("LENS_CACHE_DIR")
    if root:
        path = Path(root).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "lens-workbench"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(20, "not a folder", str(path))
    except OSError as exc:
        source = "LENS_CACHE_DIR" if root else "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "HOME"
        raise LensInputError(f"the workbench's cache folder {path} (from {source}) cannot be made: "
                             f"{exc.strerror or exc}; expected a writable folder — set LENS_CACHE_DIR to one") from None
    return path
