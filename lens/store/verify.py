"""``lens store verify DIR``: read every byte of a store, check every checksum and the schema, report.

Unlike reading (which stops at the first damaged file it touches), verification goes on past a
problem so the report lists every damaged file. It also recounts the non-finite values of every
layer block and compares them with the counts the capture recorded. A link anywhere in the store
that resolves outside its folder (a ``shards/`` linked elsewhere) makes the store damaged: its bytes
are not the store's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lens.errors import LensInputError, StoreCorruptError
from lens.store.format import MANIFEST, PARTIAL, SHARDS, TOKEN_COLUMNS, count_nonfinite_stored, load_manifest
from lens.store.manifest import Manifest
from lens.store.lock import LOCK, describe_holder, read_holder
from lens.store.schema import expected_files
from lens.store.shardfiles import ShardFiles
from lens.store.stats import read_shard_stats


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify_store`` found. ``problems``: one line per damaged file (empty when the store is
    sound); ``warnings``: things that do not make data wrong (leftovers of an interrupted capture, a
    format 1 store's weaker checks); ``nonfinite``: site -> {layer: count} of the NaN/inf values counted in
    the data, non-zero counts only; ``outside``: links resolving outside the store folder (problems too)."""

    path: str
    format_version: int
    n_shards: int
    n_tokens: int
    complete: bool
    n_files: int
    n_bytes: int
    problems: tuple = ()
    warnings: tuple = ()
    nonfinite: dict = field(default_factory=dict)
    outside: tuple = ()  # links in the store that resolve outside it (each is also a problem)

    @property
    def ok(self) -> bool:
        return not self.problems


_count_nonfinite = count_nonfinite_stored  # the name lens.store.parts imports


def verify_files(root: Path, manifest: Manifest | dict, recount: bool = True, found: dict | None = None) -> list[str]:
    """Every problem in the shards of the store at ``root``, one line each. ``found``, if given, receives
    the non-finite values counted in the data: site name -> {layer: count} (non-zero counts only)."""
    manifest = Manifest.from_dict(manifest, validate=False)  # a value is kept as it is
    problems = []
    for shard in manifest.shards:
        # no cached verdicts: every byte is read; the recount below reports a wrong count (and goes on)
        files = ShardFiles(root, manifest, verify=True, check_nonfinite=False)
        for parsed, layers in manifest.sites.items():
            site = parsed.value
            fname = f"{site}.npy"
            try:
                path, _ = files.site_file(shard, site)
                if "header_bytes" not in shard.files[fname]:  # format 1 also recorded a whole-file CRC
                    files.file_crc(shard, fname, path)
                recorded = None if shard.nonfinite is None else shard.nonfinite.get(parsed)
                for idx in range(len(layers)):
                    block = files.layer_block(shard, site, idx)
                    if not recount:
                        continue
                    got = _count_nonfinite(block, manifest.dtype)
                    if got and found is not None:
                        by_layer = found.setdefault(site, {})
                        by_layer[layers[idx]] = by_layer.get(layers[idx], 0) + got
                    if recorded is not None and got != recorded[idx]:
                        at = site if layers[idx] is None else f"{site} layer {layers[idx]}"
                        problems.append(f"{path}: layer block {idx} ({at}) holds {got} non-finite values, the "
                                        f"manifest records {recorded[idx]}")
            except StoreCorruptError as exc:
                problems.append(str(exc))
        for col in TOKEN_COLUMNS:
            try:
                files.token_column(shard, col)
            except StoreCorruptError as exc:
                problems.append(str(exc))
        if shard.stats:
            for parsed, layers in manifest.sites.items():
                try:
                    read_shard_stats(files, shard, parsed.value, len(layers), manifest.width(parsed))
                except StoreCorruptError as exc:
                    problems.append(str(exc))
    return problems


def _escapes(root: Path) -> tuple[list[str], list[str]]:
    """Links in the store: ``(outside, inside)`` — one line per link whose target lies outside the store
    folder (or cannot be resolved), and per link that stays inside it. A capture never makes a link."""
    base = root.resolve()
    outside, inside = [], []
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs) + sorted(files):
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                outside.append(f"{path}: a link that does not resolve ({os.readlink(path)!r})")
                continue
            if target != base and base not in target.parents:
                outside.append(f"{path}: a link to {target}, outside the store")
            else:
                inside.append(f"{path}: a link to {target} (a capture never makes links)")
    return outside, inside


def _leftovers(root: Path, manifest: Manifest) -> list[str]:
    out = []
    listed = {s.name for s in manifest.shards}
    shards = root / SHARDS
    if shards.is_dir():
        for entry in sorted(shards.iterdir()):
            if entry.name in listed:
                shard = next(s for s in manifest.shards if s.name == entry.name)
                extra = sorted(set(p.name for p in entry.iterdir()) - expected_files([s.value for s in manifest.sites])
                               - set(shard.stats or {})) \
                    if entry.is_dir() else []
                if extra:
                    out.append(f"{entry}: files not in the manifest (ignored by readers): {', '.join(extra)}")
            elif entry.name.endswith(PARTIAL):
                out.append(f"{entry}: a partial shard of an interrupted capture (--resume deletes it)")
            else:
                out.append(f"{entry}: not listed in the manifest (ignored by readers; --resume deletes a "
                           "shard left by an interrupted commit)")
    if (root / (MANIFEST + ".tmp")).exists():
        out.append(f"{root / (MANIFEST + '.tmp')}: left by an interrupted manifest write (ignored)")
    if (root / LOCK).exists():
        out.append(f"{root / LOCK}: a capture may be writing this store now ({describe_holder(read_holder(root / LOCK))}); "
                   "only its committed shards were checked")
    return out


def verify_store(path) -> VerifyReport:
    """Check the store at ``path`` completely. Raises ``LensInputError`` / ``StoreCorruptError`` when
    the manifest itself is missing or unusable (nothing else can be checked then)."""
    root = Path(path)
    if not root.is_dir():
        raise LensInputError(f"store not found: {root} (expected a store folder)")
    manifest = load_manifest(root)
    found: dict = {}
    problems = verify_files(root, manifest, found=found)
    # a path that resolves outside the folder is not part of this store: its bytes can change (or vanish)
    # with someone else's files, and a capture would refuse to write there. Damaged, not a warning.
    outside, inside = _escapes(root)
    problems = [f"{line}: the store is not self-contained (copy the data into the store folder, or capture "
                "again)" for line in outside] + problems
    warnings = _leftovers(root, manifest) + inside
    if manifest.format_version < 2:
        warnings.insert(0, f"{root}: format 1 store — its manifest has no checksum and its .npy headers no "
                           "checksums (they were checked against the manifest); recapture for full protection")
    nonfinite = {}  # what the data holds (recounted), not what the manifest says
    for parsed, layers in manifest.sites.items():
        site = parsed.value
        bad = {l: found[site][l] for l in layers if found.get(site, {}).get(l)}
        if bad:
            nonfinite[site] = bad
    n_bytes = sum(meta["bytes"] for s in manifest.shards for meta in s.files.values())
    return VerifyReport(path=str(root), format_version=manifest.format_version, n_shards=len(manifest.shards),
                        n_tokens=manifest.n_tokens, complete=manifest.complete,
                        n_files=sum(len(s.files) for s in manifest.shards) + 1, n_bytes=n_bytes,
                        problems=tuple(problems), warnings=tuple(warnings), nonfinite=nonfinite,
                        outside=tuple(outside))


__all__ = ["VerifyReport", "verify_store", "verify_files"]
