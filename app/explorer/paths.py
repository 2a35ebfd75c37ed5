"""Every path the explorer opens goes through :func:`safe_path`: it must stay under a configured root.

A user value (a widget, a query parameter, a command-line flag) may name a folder relative to a root;
``..`` components and absolute paths outside the root are refused, and symbolic links are resolved
before the check so a link cannot lead out of the root either.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath


class UnsafePathError(ValueError):
    """A user-supplied path that would leave the configured root."""


def safe_path(root, user_value) -> Path:
    """``root / user_value``, resolved, guaranteed to lie under ``root`` (or be ``root``).

    Raises :class:`UnsafePathError` for ``..`` components, NUL bytes, and absolute paths or links
    that resolve outside ``root``. An empty ``user_value`` means the root itself.
    """
    if root is None or str(root) == "":
        raise UnsafePathError("no root folder is configured")
    base = Path(root).expanduser().resolve()
    value = "" if user_value is None else str(user_value)
    if "\x00" in value:
        raise UnsafePathError("path contains a NUL byte")
    parts = PurePath(value.replace("\\", "/")).parts
    if ".." in parts:
        raise UnsafePathError(f"path {value!r} contains '..'; only folders under {base} can be opened")
    candidate = Path(value) if os.path.isabs(value) else base / value
    resolved = candidate.expanduser().resolve()
    if resolved != base and base not in resolved.parents:
        raise UnsafePathError(f"path {value!r} is outside {base}; only folders under it can be opened")
    return resolved


def relative_to_root(root, path) -> str:
    """``path`` relative to ``root`` as a POSIX string ('.' for the root itself)."""
    rel = Path(path).resolve().relative_to(Path(root).resolve())
    return rel.as_posix() or "."
