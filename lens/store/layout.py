"""A store's folder by name: its manifest file, its shards folder, and the one answer to "is this folder an
activation store?" (:func:`is_store`). Cheap to import (no torch, no numpy): the command line's parser and the
explorer's data layer ask it too."""

from __future__ import annotations

from pathlib import Path

MANIFEST = "manifest.json"
SHARDS = "shards"


def is_store(path) -> bool:
    """Whether ``path`` is an activation store's folder: it holds a ``manifest.json``. A store being written, an
    incomplete one and a damaged one count too: reading it (:func:`lens.store.format.read_manifest`) says which,
    so a damaged store is reported as damaged, never taken for an empty folder to capture into.
    (:func:`lens.store.format.enclosing_store`, which guards writes, also asks that its manifest name the
    store format.)"""
    return path is not None and (Path(path) / MANIFEST).is_file()
