"""Time and memory of the studies that run the model, on a random model of real width.

    PYTHONPATH=. nice -n 10 .venv/bin/python benchmarks/scale_models.py [--d 2048] [--layers 6]
        [--vocab 128256] [--tokens 20000] [--studies logit-lens,tuned-lens,...] [--dir /tmp/lens-scale-models]

``benchmarks/scale.py`` measures the studies that only read a store on synthetic stores; this one measures
the rest — the studies that decode through the unembedding or run the model again — on a random Llama of
the width researchers study (by default Llama-3.2-1B's shape: d_model 2048, 32 heads of which 8 key/value,
MLP 8192, a tied 128,256-word vocabulary; ``--layers`` blocks instead of 16, to keep the run to about an
hour on 2 cores), at the sample sizes the main job uses (every study's defaults, ``--tokens`` for the
corpus budget). The model folder is written once (safetensors in bfloat16, loaded in float32 on the CPU as
``--model-dtype auto`` does; SmolLM2's tokenizer grown to the vocabulary with reserved tokens, so every id
the model can predict decodes). Then, each in a fresh process: the main job's shared store of the
selected studies' sites over wiki-sample (``capture``), and each study reading it
(``studies.core.runner.run_study``, progress off), with the child's wall and CPU seconds and peak RSS from
``wait4``. context-knob runs with ``require_known=false`` (a random model knows no capitals: the main job
would mark it n/a after its knowledge check, which measures nothing). Weights alone are
params × 4 bytes in float32: the table says how much each study holds beyond them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.common import measure  # noqa: E402

MODEL_STUDIES = {  # study -> config overrides
    "prediction-gains": {},  # with its logit-lens check: decodes a sample of every layer
    "logit-lens": {},
    "tuned-lens": {},
    "layer-ablation": {},
    "intrinsic-dim": {},  # captures its shuffled-text control store
    "senses": {},
    "filler-tokens": {},
    "context-knob": {"require_known": False},
}
CORPUS = "wiki-sample"


def _base(folder: str, store: str, tokens: int) -> dict:
    return {"model": folder, "corpus": CORPUS, "max_tokens": tokens, "store": store, "progress": False}


def _child(name: str, folder: str, store: str, out: str, tokens: int, studies: list) -> None:
    """``capture``: the shared store of ``studies``; else run study ``name`` on it. Prints its seconds."""
    from studies.core.config import config_from_dict
    from studies.core.registry import get_study

    t0 = time.perf_counter()
    if name == "capture":
        from studies.job.main_job import _shared_store, shared_config

        chosen = {s: get_study(s) for s in studies}
        shared = shared_config(_base(folder, store, tokens))
        configs = {s: config_from_dict(chosen[s].config, {**_base(folder, store, tokens), **MODEL_STUDIES[s]})
                   for s in chosen}
        _shared_store(shared, Path(out), chosen, configs, progress=False)
    else:
        from studies.core.runner import run_study

        study = get_study(name)
        run_study(study, config_from_dict(study.config, {**_base(folder, store, tokens), **MODEL_STUDIES[name]}),
                  out)
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=128_256)
    ap.add_argument("--mlp", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=20_000, help="the corpus budget (the main job's --max-tokens)")
    ap.add_argument("--studies", default=",".join(MODEL_STUDIES))
    ap.add_argument("--dir", default="/tmp/lens-scale-models")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--reuse", action="store_true", help="reuse the model folder and a complete store in --dir")
    ap.add_argument("--json", help="also write the measurements here")
    ap.add_argument("--child", nargs=5, metavar=("NAME", "MODEL", "STORE", "OUT", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [s for s in args.studies.split(",") if s]
    unknown = [s for s in names if s not in MODEL_STUDIES]
    if unknown:
        ap.error(f"not a model-running study: {', '.join(unknown)} (expected some of {', '.join(MODEL_STUDIES)})")
    if args.child:
        name, folder, store, out, tokens = args.child
        _child(name, folder, store, out, int(tokens), names)
        return 0
    base = Path(args.dir)
    folder = base / f"llama-d{args.d}-l{args.layers}-v{args.vocab}"
    store = base / f"store-{folder.name}-n{args.tokens}"
    if not (args.reuse and (folder / "config.json").is_file()):
        t0 = time.perf_counter()
        n_params = write_model(folder, args.d, args.layers, args.vocab, args.mlp, args.heads, args.kv_heads)
        print(f"# model: {n_params / 1e6:.0f}M parameters ({n_params * 4 / 1e9:.2f} GB in float32), "
              f"written in {time.perf_counter() - t0:.0f} s ({folder})", flush=True)
    else:
        print(f"# model: reusing {folder}", flush=True)

    def run(name: str, out: Path) -> dict:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--studies", ",".join(names),
               "--child", name, str(folder), str(store), str(out), str(args.tokens)]
        r = measure(cmd, args.timeout)
        what = r.get("error") or f"{r['seconds']:.1f} s ({r['cpu']:.1f} s CPU), peak RSS {r['rss'] / 1e9:.2f} GB"
        print(f"#   {name}: {what}", flush=True)
        return r

    rows = {}
    manifest = store / "manifest.json"
    if not (args.reuse and manifest.is_file() and json.loads(manifest.read_text()).get("complete")):
        shutil.rmtree(store, ignore_errors=True)
        rows["capture"] = run("capture", base)
    for name in names:
        out = base / f"out-{name}"
        rows[name] = run(name, out)
        shutil.rmtree(out, ignore_errors=True)
    print(f"\nrandom Llama d_model {args.d}, {args.layers} layers, vocabulary {args.vocab:,}, float32 on "
          f"{args.tokens:,} tokens of {CORPUS}: wall s (CPU s) / peak RSS GB")
    print("| study | wall s (CPU s) / peak RSS GB |\n|---|---|")
    for name, r in rows.items():
        cell = r["error"] if "error" in r else f"{r['seconds']:.0f} ({r['cpu']:.0f}) / {r['rss'] / 1e9:.2f}"
        print(f"| {name} | {cell} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"d": args.d, "layers": args.layers, "vocab": args.vocab,
                                               "tokens": args.tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
