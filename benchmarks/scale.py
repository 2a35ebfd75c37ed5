"""Time and memory of every study that reads a store, on stores of realistic width and length.

    PYTHONPATH=. nice -n 10 .venv/bin/python benchmarks/scale.py --d 2048 --tokens 20000,50000 [--layers 7]
        [--studies anisotropy,linearity,...] [--dir /tmp/lens-scale] [--keep]

For each N it writes a float16 store of ``--layers`` resid_post layers plus ``embed`` (d_model ``--d``,
a 128k vocabulary in the token table) with synthetic states of planted structure (a mean direction that
grows with depth, two rogue dimensions, massive activations at window position 0, a token-identity
component so probes and ridge fits have signal, a low-rank latent and isotropic noise), written through
the store's own writer (so it carries the per-shard statistics of ``lens.store.stats``). Then it runs each
study in a fresh subprocess (``studies.core.runner.run_study`` on that store, progress off) and reads the
child's peak RSS from ``wait4``; ``store-stats`` is ``Store.stats`` (recorded sums) and ``stats-pass``
the same statistics recomputed from the rows (what a store without them costs). Prints per study and
N: wall seconds, peak RSS, and the exponent of time in N (least-squares slope of log t on log N over
the N measured). ``tuned-lens`` and ``logit-lens`` (not run unless named) decode through a random Llama of
the store's shape (d_model, layers, the 128k vocabulary, MLP 4 × d), written once beside the stores as the
folder the stores name as their model. A store takes layers+1 × N × d × 2 bytes: check ``df -h`` first; stores are deleted
afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import fit_exponent, measure, write_model  # noqa: E402

STUDIES = {  # study -> config overrides that let it run on a store alone (no model, no control store)
    "anisotropy": {},
    "linearity": {},
    "intrinsic-dim": {"shuffled": False},
    "probes": {"letter": "7"},  # token text is "t<id>": about a third of the tokens hold a 7
    "prediction-gains": {"logit_lens": False},
    "context-memory": {},
}
# studies that also decode through the model: run with a random Llama of the store's shape (d_model, layers,
# vocabulary; benchmarks/scale_models.py's) saved as the folder the store names as its model
LENS_STUDIES = {
    "tuned-lens": {},
    "logit-lens": {"resid_mid": False},  # the synthetic store holds resid_post and embed only
}
EXTRA = ("store-stats", "stats-pass")
VOCAB = 128_256
SEQ = 128
SHARD_WINDOWS = 64


def _tokens(n: int, rng) -> dict:
    """A token table of ``n`` tokens in 128-token windows of documents of 200..3000 tokens."""
    doc_len = rng.integers(200, 3000, size=n // 200 + 2)
    doc = np.repeat(np.arange(len(doc_len)), doc_len)[:n]
    starts = np.r_[0, np.cumsum(doc_len)][:len(doc_len)]
    doc_pos = np.arange(n) - starts[doc]
    window = np.arange(n) // SEQ
    pos = np.arange(n) % SEQ
    token_id = (rng.zipf(1.3, size=n) * 7919) % VOCAB
    nxt = np.r_[token_id[1:], -1]
    nxt[np.r_[doc[1:] != doc[:-1], True]] = -1
    special = doc_pos == 0
    token_id[special] = 1
    return {"doc": doc, "window": window, "pos": pos, "doc_pos": np.where(special, -1, doc_pos),
            "token_id": token_id, "next_token_id": nxt, "special": special}


class _Planted:
    """Per-layer parameters of the synthetic states (seeded, d-wide)."""

    def __init__(self, d: int, n_layers: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.d = d
        self.mu = rng.standard_normal(d).astype(np.float32)
        self.codes = rng.standard_normal((4096, 32)).astype(np.float32)
        self.proj = [rng.standard_normal((32, d)).astype(np.float32) / np.sqrt(32) for _ in range(n_layers + 1)]
        self.latent = [rng.standard_normal((8, d)).astype(np.float32) for _ in range(n_layers + 1)]

    def states(self, li: int, frac: float, tok: dict, lo: int, hi: int, rng) -> np.ndarray:
        n = hi - lo
        x = rng.standard_normal((n, self.d), dtype=np.float32)
        x += (0.5 + 2.0 * frac) * self.mu
        x += 2.0 * (self.codes[tok["token_id"][lo:hi] % 4096] @ self.proj[li])
        x += rng.standard_normal((n, 8), dtype=np.float32) @ self.latent[li]
        x[:, 7] += 8.0 + 30.0 * frac   # rogue dimensions (Timkey & van Schijndel 2021)
        x[:, self.d // 3] -= 5.0 + 20.0 * frac
        first = tok["pos"][lo:hi] == 0  # massive activations at the attention sink
        x[first, 3] += 400.0
        return x


def write_store(root: Path, d: int, n_layers: int, n: int, seed: int = 0) -> Path:
    import lens
    from lens.store.format import DTYPES, FORMAT, FORMAT_VERSION, settings_fingerprint
    from lens.store.manifest import Manifest
    from lens.store.writer import ShardWriter

    rng = np.random.default_rng(seed)
    tok = _tokens(n, rng)
    tok["token"] = np.char.add("t", tok["token_id"].astype(str))
    card = lens.load_model("tiny-llama").card().to_dict()
    model_id = f"synthetic-d{d}"
    card.update(model_id=model_id, n_layers=n_layers, d_model=d, d_vocab=VOCAB, revision="planted")
    settings = {"model": model_id, "tokens": n, "d": d, "layers": n_layers, "seed": seed}
    sites = {"resid_post": list(range(n_layers)), "embed": [None]}
    manifest = Manifest.first({"format": FORMAT, "format_version": FORMAT_VERSION, "model": card,
                "corpus": {"name": "synthetic", "source": "benchmarks/scale.py", "fingerprint": str(seed),
                           "transform": None},
                "settings": settings, "fingerprint": settings_fingerprint(settings), "sites": sites, "d_model": d,
                "widths": {}, "dtype": "float16", "storage_dtype": DTYPES["float16"][2], "n_tokens": 0,
                "nonfinite": {s: [0] * len(l) for s, l in sites.items()}, "n_tokens_planned": n,
                "n_windows_planned": int(tok["window"][-1]) + 1, "shards": [], "complete": False,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    planted = _Planted(d, n_layers, seed)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    writer = ShardWriter(root, manifest)
    writer.recover()
    n_windows = int(manifest.n_windows_planned or 0)
    for w_lo in range(0, n_windows, SHARD_WINDOWS):
        w_hi = min(w_lo + SHARD_WINDOWS, n_windows)
        lo, hi = w_lo * SEQ, min(w_hi * SEQ, n)
        writer.begin(w_lo, w_hi, hi - lo)
        for li in range(n_layers):
            writer.add_rows("resid_post", li, 0, planted.states(li + 1, li / max(1, n_layers - 1), tok, lo, hi, rng)
                            .astype(np.float16))
        writer.add_rows("embed", 0, 0, planted.states(0, 0.0, tok, lo, hi, rng).astype(np.float16))
        writer.finish({k: v[lo:hi] for k, v in tok.items()})
    writer.complete()
    return root


def _child(name: str, store: str, out: str) -> None:
    """Run one study (or a stats pseudo-study) on ``store``; print its wall seconds as JSON."""
    import lens

    t0 = time.perf_counter()
    if name in EXTRA:
        s = lens.open_store(store)
        if name == "store-stats":
            st = s.stats("resid_post", True, 1)
        else:
            from lens.store.stats import _computed

            st = _computed(s, "resid_post", s.manifest["sites"]["resid_post"], True, 1)
        import geometry

        geometry.anisotropy_from_stats(st)
    else:
        from studies.core.config import config_from_dict
        from studies.core.registry import get_study
        from studies.core.runner import run_study

        study = get_study(name)
        model_id = json.loads((Path(store) / "manifest.json").read_text())["model"]["model_id"]
        if name in LENS_STUDIES:  # the model is the folder of that name beside the store (a relative path)
            store, out = str(Path(store).resolve()), str(Path(out).resolve())
            os.chdir(Path(store).parent)
        config = config_from_dict(study.config, {"model": model_id, "store": store, "progress": False,
                                                 **{**STUDIES, **LENS_STUDIES}[name]})
        run_study(study, config, out)
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def run_child(name: str, store: Path, out: Path, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, str(store), str(out)]
    return measure(cmd, timeout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--tokens", default="20000,50000")
    ap.add_argument("--studies", default=",".join((*STUDIES, *EXTRA)))
    ap.add_argument("--dir", default="/tmp/lens-scale")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="reuse a complete store of the same shape in --dir")
    ap.add_argument("--write-only", action="store_true", help="only write the stores (time the writer)")
    ap.add_argument("--json", help="also write the measurements here")
    ap.add_argument("--child", nargs=3, metavar=("STUDY", "STORE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    ns = [int(float(x)) for x in args.tokens.split(",")]
    names = [s for s in args.studies.split(",") if s]
    base = Path(args.dir)
    rows = {name: {} for name in names}
    model = base / f"synthetic-d{args.d}"
    if any(n in LENS_STUDIES for n in names) and not (model / "config.json").is_file():
        n_params = write_model(model, args.d, args.layers, VOCAB, mlp=4 * args.d, heads=max(1, args.d // 64),
                               kv_heads=min(8, max(1, args.d // 64)))
        print(f"# model for the lens studies: a random Llama of {n_params / 1e6:.0f}M parameters ({model})", flush=True)
    for n in ns:
        store = base / f"store-d{args.d}-n{n}"
        t0 = time.perf_counter()
        if not (args.reuse and (store / "manifest.json").is_file()
                and json.loads((store / "manifest.json").read_text()).get("complete")):
            write_store(store, args.d, args.layers, n)
        size = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
        print(f"# N={n}: wrote {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s ({store})", flush=True)
        if args.write_only:
            continue
        for name in names:
            r = run_child(name, store, base / f"out-{name}-{n}", args.timeout)
            rows[name][n] = r
            what = r.get("error") or f"{r['seconds']:.1f} s ({r['cpu']:.1f} s CPU), peak RSS {r['rss'] / 1e9:.2f} GB"
            print(f"#   {name}: {what}", flush=True)
            shutil.rmtree(base / f"out-{name}-{n}", ignore_errors=True)
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)
    if args.write_only:
        return 0
    print(f"\nd_model {args.d}, {args.layers} layers + embed, float16; per N: wall s (CPU s) / peak RSS GB; "
          "exponent = slope of log t on log N, wall (CPU)")
    head = "| study | " + " | ".join(f"N={n:,}" for n in ns) + " | exponent |"
    print(head)
    print("|" + "---|" * (len(ns) + 2))
    for name in names:
        cells = []
        for n in ns:
            r = rows[name].get(n, {})
            cells.append(r["error"] if "error" in r else
                         f"{r['seconds']:.1f} ({r['cpu']:.1f}) / {r['rss'] / 1e9:.2f}")
        k = fit_exponent(ns, [rows[name].get(n, {}).get("seconds") for n in ns])
        kc = fit_exponent(ns, [rows[name].get(n, {}).get("cpu") for n in ns])
        exp = "" if k is None else f"{k:.2f} ({kc:.2f})"
        print(f"| {name} | " + " | ".join(cells) + f" | {exp} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"d": args.d, "layers": args.layers, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
