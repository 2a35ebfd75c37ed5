"""The results folder: one format for every study, the explorer and the report.

```
OUT/
  result.json       # study, model, corpus, n_tokens, config, versions, git_revision, layers, layer_axis,
                    # metrics (name -> list, one entry per layer; NaN as null), summary (scalars)
  arrays.npz        # the arrays behind the metrics (numeric / unicode only; read without pickle)
  figure.html       # the main plotly figure; figure-<name>.html for the others
  figures/<name>.json  # the same figures as plotly JSON, for the explorer and the report
```
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import platform
import subprocess
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import plotly.io as pio

from lens.errors import LensInputError
from lens.runtime.atomic import atomic_path, write_json_file, write_text_atomic
from lens.store.layout import is_store
from studies.core.axis import LayerAxis
from studies.reporting.result_file import RESULT_FILE, ResultFile

ARRAYS_FILE = "arrays.npz"
SCHEMA_VERSION = 1


def git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5)
        rev = out.stdout.strip()
        if rev:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def machine_line() -> str:
    """This machine's processor and logical core count, for a record of where something ran."""
    name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.lower().startswith("model name")), "")
    except OSError:
        pass
    return f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"


# the instruction sets that decide how fast the studies' products run on a CPU (issue #38: an AMD EPYC without
# AVX512 runs the main job about twice as long as an Intel Xeon with AMX)
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_features() -> list[str]:
    """Which of :data:`CPU_FEATURES` this machine's processor has (empty where /proc/cpuinfo is not readable)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.lower().startswith("flags")), [])
    except OSError:
        return []
    return [name for name in CPU_FEATURES if name in flags]


def _clean(value):
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python, arrays -> lists, dataclasses -> dicts."""
    if hasattr(value, "to_record") and not isinstance(value, type):  # a study's config: its flat record
        return _clean(value.to_record())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _clean(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return _clean(value.tolist())
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    return str(value)


@dataclass(frozen=True)
class ResultRecord:
    """A results folder as read back: what the explorer, the report and the headlines consume."""

    path: Path
    study: str
    model: str
    corpus: str
    n_tokens: int
    config: dict
    layers: list
    metrics: dict
    summary: dict
    versions: dict = field(default_factory=dict)
    git_revision: str = ""
    created: str = ""
    wall_time_s: float | None = None
    extra: dict = field(default_factory=dict)
    # the layer axis the run recorded; None for a result written before runs recorded it (read as declared)
    layer_axis: LayerAxis | None = None

    def arrays(self) -> dict:
        path = self.path / ARRAYS_FILE
        return read_arrays_file(path) if path.is_file() else {}

    @property
    def figure_paths(self) -> dict:
        out = {}
        if (self.path / "figure.html").is_file():
            out["main"] = self.path / "figure.html"
        for p in sorted(self.path.glob("figure-*.html")):
            out[p.stem[len("figure-"):]] = p
        return out

    def figures(self) -> dict:
        """name -> plotly Figure, rebuilt from the saved JSON."""
        out = {}
        folder = self.path / "figures"
        if folder.is_dir():
            for p in sorted(folder.glob("*.json")):
                out[p.stem] = pio.from_json(p.read_text(encoding="utf-8"))
        return out

    def metric(self, name: str) -> np.ndarray:
        if name not in self.metrics:
            raise LensInputError(f"{self.study} result has no metric {name!r} (has {', '.join(self.metrics)})")
        return np.array([np.nan if v is None else v for v in self.metrics[name]], dtype=float)


STORE_SUFFIX_PARTS = 3  # a recorded store path's last components tried under the run's folder ("run/study/store")


def store_candidates(recorded, run_dir) -> list[Path]:
    """Where the store a result read may lie now, in the order to try: ``recorded`` (a result's ``config.store``
    or a main job's ``store``, as the job was given it: ``results/store``, relative to the folder the job ran
    in, or an absolute path of the machine it ran on) as it stands, then its last 3, 2 and 1 components under
    ``run_dir`` (the job's ``--out``: ``results/store`` -> ``RUN/store``), which finds it after the results folder
    is copied or moved. Empty when nothing is recorded. The one answer to "which store did this result
    read?" (:func:`store_read`; the explorer tries the same paths, inside its roots)."""
    if not recorded:
        return []
    given = Path(recorded)
    parts = [p for p in given.parts if p not in (given.anchor, "", ".")]
    return [given, *(Path(run_dir).joinpath(*parts[-n:]) for n in range(min(len(parts), STORE_SUFFIX_PARTS), 0, -1))]


def store_read(recorded, run_dir) -> Path | None:
    """The first of :func:`store_candidates` that is a store (:func:`lens.store.layout.is_store`), or None."""
    return next((c for c in store_candidates(recorded, run_dir) if is_store(c)), None)


def _within(path: Path, store) -> Path | None:
    """``store`` (resolved) when ``path`` is that folder or lies inside it, else None."""
    if store is None:
        return None
    store = Path(store).resolve()
    return store if path.resolve().is_relative_to(store) else None


def require_results_folder(path, store=None) -> None:
    """Refuse, before any work, a results folder that cannot be one: ``path`` is an activation store's
    folder or lies inside one (:func:`lens.store.format.enclosing_store`; or inside ``store``, the folder
    the study will capture its store into), ``path`` or a folder on the way
    to it is a file, or the folder it would be made in cannot be written (``mkdir`` would fail only
    after the study has run). The last two raise the OSError the command line turns into one line."""
    from lens.store.format import MANIFEST, enclosing_store

    path = Path(path)
    store = enclosing_store(path) or _within(path, store)
    if store is not None:
        where = "is" if store == path.resolve() else "lies inside"
        what = "the activation store" if (store / MANIFEST).is_file() else "the folder --store captures into,"
        raise LensInputError(f"--out {path} {where} {what} {store}: results go in a folder of their own, not in a "
                             f"store's folder; choose another --out (e.g. {store.parent / 'results'})")
    for at in (path, *path.parents):
        if at.is_dir():
            if not os.access(at, os.W_OK):  # a read-only filesystem (root too) or no permission: say so now
                number = errno.EROFS if os.statvfs(at).f_flag & os.ST_RDONLY else errno.EACCES
                raise OSError(number, os.strerror(number), str(at))
            return
        if at.exists() or at.is_symlink():
            where = "" if at == path else f" ({at} on the way to it is a file)"
            raise LensInputError(f"--out {path}: expected a folder for the results, but it is not one{where}; "
                                 "choose another --out")


def write_result(out_dir, *, study: str, model: str, corpus: str, n_tokens: int, config=None,
                 layers=(), metrics: dict | None = None, summary: dict | None = None,
                 arrays: dict | None = None, figures: dict | None = None, wall_time_s: float | None = None,
                 extra: dict | None = None, layer_axis: dict | None = None) -> Path:
    """Write a results folder (see the module docstring); returns its path. ``layer_axis``: the axis the
    run read (``{kind, site, note}``, :meth:`studies.core.contract.LayerAxis.to_dict`)."""
    from lens.capturing.capture import library_versions

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the folder is complete once result.json exists: an older one goes first, so a write that fails
    # half-way (a full disk) never leaves the old record beside new arrays
    (out / RESULT_FILE).unlink(missing_ok=True)
    layers = list(layers)
    metrics = dict(metrics or {})
    for name, values in metrics.items():
        if len(values) != len(layers):
            raise ValueError(f"metric {name!r} has {len(values)} values for {len(layers)} layers")
    record = {
        "schema_version": SCHEMA_VERSION,
        "study": study, "model": model, "corpus": corpus, "n_tokens": int(n_tokens),
        "config": _clean(config) if config is not None else {},
        "versions": library_versions(), "git_revision": git_revision(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_time_s": wall_time_s,
        "layers": _clean(layers), "metrics": _clean(metrics), "summary": _clean(summary or {}),
        "extra": _clean(extra or {}),
    }
    if layer_axis is not None:
        record["layer_axis"] = _clean(layer_axis)
    value = ResultFile.from_dict(record, str(out / RESULT_FILE))  # the record a reader will get, checked now
    if arrays:
        safe = {}
        for k, v in arrays.items():
            a = np.asarray(v)
            if a.dtype == object:
                raise ValueError(f"array {k!r} has dtype object; results store numeric or string arrays only")
            safe[k] = a
        with atomic_path(out / ARRAYS_FILE, ".npz") as tmp:
            np.savez_compressed(tmp, **safe)
    if figures:
        (out / "figures").mkdir(exist_ok=True)
        for name, fig in figures.items():
            html = out / ("figure.html" if name == "main" else f"figure-{name}.html")
            with atomic_path(html) as tmp:
                fig.write_html(str(tmp), include_plotlyjs="cdn" if os.environ.get("LENS_HTML_CDN") else True,
                               full_html=True)
            write_text_atomic(out / "figures" / f"{name}.json", fig.to_json(), sync=False)
    write_json_file(out / RESULT_FILE, value.to_dict())  # last: a folder with result.json is complete
    return out


def read_arrays_file(path) -> dict:
    """A result's ``arrays.npz`` as ``{name: array}`` (never unpickled); a damaged file (not a zip archive,
    cut short, an object array) raises LensInputError naming it."""
    def damaged(reason: str) -> LensInputError:
        return LensInputError(f"{path} is damaged and cannot be read ({reason}): expected the arrays a study "
                              "wrote; run the study again")

    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise damaged(exc.strerror or str(exc)) from None
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # numpy would try it as a pickle next
        raise damaged("not an .npz archive")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (zipfile.BadZipFile, zlib.error, ValueError, EOFError, KeyError, OSError) as exc:
        reason = "an object array, which is never unpickled" if "pickle" in str(exc) else str(exc) or type(exc).__name__
        raise damaged(reason) from None


def read_result(path) -> ResultRecord:
    """The results folder ``path`` as read back: its ``result.json`` parsed and checked once
    (:class:`studies.reporting.result_file.ResultFile`; a malformed one is one LensInputError line naming it)."""
    path = Path(path)
    file = path / RESULT_FILE
    if not file.is_file():
        raise LensInputError(f"{path} is not a results folder: expected {RESULT_FILE}")
    return record_of(path, ResultFile.read(file))


def record_of(path: Path, value: ResultFile) -> ResultRecord:
    """The :class:`ResultRecord` of the results folder ``path`` whose ``result.json`` is ``value`` (plain JSON
    containers, as the explorer, the report and the headlines read them)."""
    d = value.to_dict()
    return ResultRecord(path=path, study=value.study, model=value.model, corpus=value.corpus, n_tokens=value.n_tokens,
                        config=d.get("config", {}), layers=d["layers"], metrics=d["metrics"], summary=d["summary"],
                        versions=d.get("versions", {}), git_revision=value.git_revision, created=value.created,
                        wall_time_s=value.wall_time_s, extra=d.get("extra", {}), layer_axis=value.layer_axis)


def find_results(root, skipped: list | None = None) -> list[ResultRecord]:
    """Every results folder under ``root`` (depth-first, sorted). A folder whose record cannot be read is
    left out; ``skipped``, when given, receives ``(folder, why)`` for each."""
    root = Path(root)
    found = []
    if not root.exists():
        return found
    for file in sorted(root.rglob(RESULT_FILE)):
        try:
            found.append(read_result(file.parent))
        except LensInputError as exc:
            if skipped is not None:
                skipped.append((file.parent, str(exc)))
    return found
