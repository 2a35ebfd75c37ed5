"""Export and import against a plain copy of the same bytes, and peak memory flat in the token count (issue 39).

    .venv/bin/python benchmarks/exchange.py [--tokens 1000000] [--d-model 2048] [--dtype bfloat16] [--formats safetensors,zarr]
        [--repeat 3] [--profile FILE, with --child]

Builds a synthetic store (one resid_post layer of ``--d-model``, random values, written by the store's own commit
protocol) of ``--tokens`` tokens and of a quarter of that, then, each in a child process (its wall seconds and peak
RSS from ``wait4``), per size: a plain copy of the store's files (``shutil.copytree``: the same bytes read and
written) and the same copy fsynced (an export is fsynced before it is renamed into place), ``lens store export
--to safetensors`` / ``zarr`` (each read back and checked), and the import of the
safetensors export back into a store (read back against every checksum). Prints each time as a ratio to the copy
(goal: <= 1.5x) and the peak RSS at both sizes (flat: it does not grow with the token count).

Each child also reports the CPU seconds of its timed part (all its threads): on a shared machine wall seconds
follow the other users' load, CPU seconds much less, so both ratios are printed. The import is a store write,
and a store write computes the store's per-shard statistics (``lens.store.stats.shard_sums``, which a capture and
a merge pay too) and reads the whole store back against its checksums (``Store.verify``); the import's child times
those two parts and the benchmark prints the import without them beside the whole.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import measure  # noqa: E402


def build_store(root: Path, n_tokens: int, d_model: int, dtype: str, seq_len: int = 1024) -> None:
    from lens.store.exchange.importer import Piece, new_manifest, write_store
    from lens.store.format import storage_np_dtype

    card = {"model_id": "synthetic", "revision": "none", "n_layers": 1, "d_model": d_model}
    n_windows = -(-n_tokens // seq_len)
    manifest = new_manifest(card, {"resid_post": [0]}, dtype, n_tokens, n_windows,
                            source={"from": "benchmark", "path": str(root)}, fidelity=None, seq_len=seq_len)
    per = 16 * seq_len  # 16k tokens a shard, as a capture's default
    rng = np.random.default_rng(0)
    sdt = storage_np_dtype(dtype)

    def pieces():
        for t0 in range(0, n_tokens, per):
            t1 = min(t0 + per, n_tokens)
            w0, w1 = t0 // seq_len, -(-t1 // seq_len)
            n = t1 - t0

            def chunks(n=n):
                for lo in range(0, n, 4096):
                    m = min(4096, n - lo)
                    x = rng.standard_normal((1, m, d_model), dtype=np.float32)
                    if dtype == "bfloat16":
                        x = (x.view(np.uint32) >> 16).astype(np.uint16)
                    yield lo, {("resid_post", 0): x[0].astype(sdt, copy=False)}

            def tokens(t0=t0, t1=t1):
                i = np.arange(t0, t1, dtype=np.int64)
                return {"doc": i // seq_len, "window": i // seq_len, "pos": i % seq_len, "doc_pos": i % seq_len,
                        "token_id": i % 50000, "next_token_id": (i + 1) % 50000, "special": i % seq_len == 0,
                        "token": np.full(t1 - t0, "tok")}

            yield Piece(w0, w1, n, tokens=tokens, chunks=chunks)

    write_store(root, manifest, pieces())


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return r.ru_utime + r.ru_stime


def _timed(owner, name: str, spent: dict):
    """Wrap ``owner.name`` so that the wall and CPU seconds spent in it add up in ``spent[name]``."""
    inner = getattr(owner, name)

    def wrapper(*a, **k):
        t0, c0 = time.perf_counter(), _cpu()
        try:
            return inner(*a, **k)
        finally:
            wall, cpu = spent.get(name, (0.0, 0.0))
            spent[name] = (wall + time.perf_counter() - t0, cpu + _cpu() - c0)

    setattr(owner, name, wrapper)


def child(args) -> None:
    import safetensors.torch  # noqa: F401 - the libraries load before the clock starts: the work is timed
    import zarr  # noqa: F401

    import lens.capturing.exchange  # noqa: F401
    import lens.store.exchange.zarr_io  # noqa: F401
    import lens.store.reader
    import lens.store.writer

    spent: dict = {}
    if args.child == "import":  # the store write's own parts, timed where they run
        _timed(lens.store.writer, "shard_sums", spent)
        _timed(lens.store.reader.Store, "verify", spent)
    prof = cProfile.Profile(time.process_time) if args.profile else None  # CPU seconds (wall follows the load)
    if prof is not None:
        prof.enable()
    t0, c0 = time.perf_counter(), _cpu()
    if args.child == "build":
        build_store(Path(args.out), int(args.src), args.d_model, args.dtype)
    elif args.child in ("copy", "copy+fsync"):
        shutil.copytree(args.src, args.out)
        if args.child == "copy+fsync":  # a copy made durable, as an export is before it is renamed into place
            for f in sorted(Path(args.out).rglob("*")):
                fd = os.open(f, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
    elif args.child == "import":
        from lens.capturing.exchange import import_store

        import_store(args.src, "safetensors", args.out)
    else:
        from lens.capturing.exchange import export_store

        export_store(args.src, args.child, args.out)
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "parts": spent}))


def _ratio(cpu, base: dict) -> str:
    b = (base.get("said") or {}).get("cpu_s")
    return f"{cpu / b:.2f}" if cpu is not None and b else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--formats", default="safetensors,zarr")
    ap.add_argument("--repeat", type=int, default=1, help="run the copies, exports and import this many times in "
                    "turns and keep each one's run of fewest CPU seconds (the machine is shared)")
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temporary folder)")
    ap.add_argument("--profile", default=None, help="run one --child under cProfile (CPU seconds of the process), its stats written to this file "
                    "(read them with python -m pstats)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--src", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    base = Path(args.dir or tempfile.mkdtemp(prefix="lens-exchange-"))
    me = [sys.executable, str(Path(__file__).resolve())]
    rows = {}
    try:
        for n in (args.tokens // 4, args.tokens):
            store = base / f"store-{n}"
            t0 = time.perf_counter()
            # in a child too: a child's peak RSS (wait4's ru_maxrss) starts from its parent's at the fork, so the parent
            # stays small
            built = measure(me + ["--child", "build", "--src", str(n), "--out", str(store), "--d-model", str(args.d_model),
                                  "--dtype", args.dtype], timeout=7200)
            if "error" in built:
                raise SystemExit(f"building the store failed: {built['error']}")
            gb = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 1e9
            print(f"{n} tokens x d {args.d_model} {args.dtype}: store {gb:.2f} GB built in {time.perf_counter() - t0:.0f} s",
                  flush=True)
            runs = [("copy", store, base / f"copy-{n}"), ("copy+fsync", store, base / f"copyfs-{n}")]
            runs += [(fmt, store, base / f"{fmt}-{n}") for fmt in args.formats.split(",")]
            if "safetensors" in args.formats:
                runs.append(("import", base / f"safetensors-{n}", base / f"import-{n}"))
            for rep in range(max(1, args.repeat)):  # in turns, so that each sees the same share of the machine's load
                shutil.rmtree(base / f"safetensors-{n}", ignore_errors=True)
                for what, src, out in runs:
                    r = measure(me + ["--child", what, "--src", str(src), "--out", str(out)], timeout=3600)
                    said = r.get("said") or {}
                    best = rows.get((what, n))
                    if best is None or ((said.get("cpu_s") or 1e30) < ((best.get("said") or {}).get("cpu_s") or 1e30)):
                        rows[(what, n)] = {**r, "rss": max(r.get("rss") or 0, (best or {}).get("rss") or 0)}
                    elif r.get("rss"):
                        best["rss"] = max(best.get("rss") or 0, r["rss"])
                    print(f"  {what:<12} {r.get('seconds', float('nan')):7.1f} s  cpu {said.get('cpu_s', float('nan')):7.1f} s"
                          f"  peak RSS {(r.get('rss') or 0) / 2**20:7.0f} MiB{'  ' + r['error'] if 'error' in r else ''}",
                          flush=True)
                    for part, (wall, cpu) in (said.get("parts") or {}).items():
                        print(f"    of which {part:<10} {wall:7.1f} s  cpu {cpu:7.1f} s", flush=True)
                    if what != "safetensors":  # keep the disk: the import reads the safetensors export
                        shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(base / f"safetensors-{n}", ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
        n = args.tokens
        copy, synced = rows[("copy", n)], rows[("copy+fsync", n)]
        print(f"ratios to a plain copy of the same bytes at {n} tokens and to that copy fsynced, in wall seconds and "
              f"in CPU seconds (goal <= 1.5; each the run of fewest CPU seconds of {max(1, args.repeat)}):")
        print(f"  {'':<24} {'wall/copy':>9} {'wall/fsynced':>12} {'cpu/copy':>9} {'cpu/fsynced':>11}")
        for (what, m), r in rows.items():
            if m != n or what.startswith("copy") or "seconds" not in r:
                continue
            said = r.get("said") or {}
            forms = [(what, r["seconds"], said.get("cpu_s"))]
            if said.get("parts"):  # the import without the store write's statistics and read-back
                forms.append((f"{what} w/o stats+verify", r["seconds"] - sum(w for w, _ in said["parts"].values()),
                              said["cpu_s"] - sum(c for _, c in said["parts"].values())))
            for label, wall, cpu in forms:
                print(f"  {label:<24} {wall / copy['seconds']:8.2f}x {wall / synced['seconds']:11.2f}x "
                      f"{_ratio(cpu, copy):>8}x {_ratio(cpu, synced):>10}x")
        print("peak RSS, a quarter of the tokens -> all of them (flat = does not grow with the token count):")
        for what in dict.fromkeys(w for w, _ in rows):
            a, b = rows.get((what, args.tokens // 4), {}), rows.get((what, n), {})
            print(f"  {what:<12} {(a.get('rss') or 0) / 2**20:7.0f} MiB -> {(b.get('rss') or 0) / 2**20:7.0f} MiB")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
