"""Where the workbench keeps derived files (dequantised models). Override with LENS_CACHE_DIR."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("LENS_CACHE_DIR")
    if root:
        path = Path(root).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "lens-workbench"
    path.mkdir(parents=True, exist_ok=True)
    return path
