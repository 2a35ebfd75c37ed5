"""What bfloat16 products would cost the logit lens' per-token metrics, and what they would save.

    .venv/bin/python benchmarks/lens_precision.py [--store results/store] [--model smollm2-135m]
                                                  [--tokens 512] [--layers 0 5 10 15 20 25 28] [--threads 1]

The lens decodes in float32 (lens.readout.logit_lens). Its unembedding product is most of a logit-lens
study's time (74% of `lens study logit-lens` on one thread, py-spy), and bfloat16 products run about twice
as fast as float32 ones on CPUs with AMX or AVX512-BF16. This measures, on stored states of a real model,
what each bfloat16 path would change, against the float32 decode of the same states:

- ``inputs bf16``: inputs rounded to bfloat16, product accumulated and returned in float32 (what oneDNN's
  bf16 math mode computes where it engages, an Intel CPU with AMX);
- ``bf16 out``: a bfloat16 product (float32 accumulation, the result rounded to bfloat16: what a CPU
  bfloat16 matmul returns, e.g. under autocast on an AVX512-BF16 EPYC).

Per layer: the largest per-token change of cross-entropy, the change of its mean, the largest change of
entropy, the share of tokens whose rank of the true next token changed and whose top-1 changed; and the
time of one (512 × d_model)·(d_model × d_vocab) product in float32 and in bfloat16, side by side. The
formulas are the lens' own (CE = logsumexp − logit of the true token, rank = how many logits beat it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lens  # noqa: E402
from benchmarks.common import interleaved  # noqa: E402
from lens.readout.logit_lens import model_readout  # noqa: E402
from lens.runtime.threads import configure_threads  # noqa: E402
from lens.sites import OUTPUT_SITE  # noqa: E402


def metrics(logits: torch.Tensor, target: torch.Tensor):
    """(CE, entropy, rank, top-1) per row, as the lens defines them."""
    lse = torch.logsumexp(logits, -1)
    logp = logits - lse[:, None]
    t = logits.gather(1, target[:, None])[:, 0]
    return lse - t, -(logp.exp() * logp).sum(-1), (logits > t[:, None]).sum(-1), logits.argmax(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="results/store")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, nargs="+", default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    configure_threads(args.threads)
    if not (Path(args.store) / "manifest.json").is_file():
        raise SystemExit(f"no store at {args.store}: run `make demo` first (or pass --store)")
    model = lens.load_model(args.model)
    store = lens.open_store(args.store)
    readout = model_readout(model)
    W = readout.weight.float()
    Wb = W.bfloat16()
    n_all = store.n_tokens
    nt_all = np.asarray(store.tokens["next_token_id"])
    rows = np.flatnonzero(nt_all >= 0)
    rows = rows[np.linspace(0, rows.size - 1, min(args.tokens, rows.size)).astype(np.int64)]
    target = torch.as_tensor(nt_all[rows])
    layers = list(store.layers(OUTPUT_SITE.value))
    picked = args.layers or layers[:: max(1, len(layers) // 6)] + [layers[-2]]
    print(f"{args.model}, {rows.size} of {n_all} stored tokens, d_vocab {W.shape[0]}, "
          f"{torch.get_num_threads()} thread(s)\n")
    print(f"{'layer':>5} {'path':<12}{'max |dCE|':>10}{'mean dCE':>10}{'max |dH|':>10}{'rank moved':>12}"
          f"{'top-1 moved':>12}")
    for layer in sorted(set(picked)):
        h = store.view(OUTPUT_SITE.value, layers=[layer]).astype(torch.float32).take(rows).at(layer)
        x = readout.pre(layer, h.float()).float()
        ref = metrics(x @ W.T, target)
        paths = {"inputs bf16": x.bfloat16().float() @ Wb.float().T, "bf16 out": (x.bfloat16() @ Wb.T).float()}
        for name, logits in paths.items():
            m = metrics(logits, target)
            print(f"{layer:>5} {name:<12}{(m[0] - ref[0]).abs().max():>10.4f}{(m[0] - ref[0]).mean():>+10.5f}"
                  f"{(m[1] - ref[1]).abs().max():>10.4f}{(m[2] != ref[2]).float().mean():>12.1%}"
                  f"{(m[3] != ref[3]).float().mean():>12.1%}")

    x = torch.randn(512, W.shape[1])
    xb, out = x.bfloat16(), torch.empty(512, W.shape[0])
    runs = {"float32": lambda: torch.matmul(x, W.T, out=out), "bfloat16": lambda: torch.matmul(xb, Wb.T)}
    med = interleaved(runs, repeats=5, warmup=1)
    flop = 2 * 512 * W.shape[1] * W.shape[0]
    print(f"\n(512 x {W.shape[1]}) . ({W.shape[1]} x {W.shape[0]}): float32 {med['float32'] * 1e3:.0f} ms "
          f"({flop / med['float32'] / 1e9:.0f} GFLOP/s), bfloat16 {med['bfloat16'] * 1e3:.0f} ms "
          f"({flop / med['bfloat16'] / 1e9:.0f} GFLOP/s): {med['float32'] / med['bfloat16']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
