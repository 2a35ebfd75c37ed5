"""What precision="bfloat16" (lens.runtime.precision.matmul_precision) buys and costs on a real model's forward.

    .venv/bin/python benchmarks/precision.py [--model smollm2-135m] [--batch-size 16] [--seq-len 128]
                                            [--threads 1] [--repeats 5]

Side by side in one run (interleaved, median of ``--repeats``), the same batch of wiki-sample windows
through the model with float32 matrix products and with bfloat16 products (float32 accumulation,
everything else float32): the time ratio, and what changes in the output — the largest logit
difference, the share of positions whose top-1 token is unchanged, mean cross-entropy and top-1
accuracy on the true next token under each. ``--threads 1`` is what a worker of a 2-core parallel main
job gets. This is the arithmetic of the interventional studies' forward passes under precision=auto.
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
from lens.text.corpora import load_corpus, make_windows  # noqa: E402
from lens.runtime.precision import (bfloat16_path, cpu_bfloat16_speedup, describe_precision, matmul_precision,  # noqa: E402
                            native_bfloat16, onednn_bf16_mode_engages)
from lens.runtime.threads import configure_threads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--force", action="store_true", help="compare even where bfloat16 is not faster")
    args = ap.parse_args()
    threads = configure_threads(args.threads)
    print(f"bfloat16 / float32 product speed here: {cpu_bfloat16_speedup():.2f}x; oneDNN bf16 math mode "
          f"{'engages' if onednn_bf16_mode_engages() else 'does not engage'}; precision=bfloat16 runs as "
          f"{bfloat16_path('cpu')}; precision=auto is {'bfloat16' if native_bfloat16('cpu') else 'float32'}")
    if not native_bfloat16("cpu") and "--force" not in sys.argv:
        print("bfloat16 products are not faster on this CPU: precision=auto is float32 here (--force compares anyway)")
        return
    model = lens.load_model(args.model)
    w = make_windows(load_corpus("wiki-sample"), model.tokenizer, seq_len=args.seq_len,
                     max_tokens=args.batch_size * args.seq_len * 4, is_causal=True)
    full = [ids for ids in w.input_ids if len(ids) == args.seq_len][: args.batch_size]
    x = torch.as_tensor(np.stack(full))

    @torch.inference_mode()
    def forward():
        return model.hf_model(input_ids=x, use_cache=False).logits.float()

    ran = []

    def bf16():
        with matmul_precision("bfloat16") as what:
            ran.append(what)
            return forward()

    t = interleaved({"float32": forward, "bfloat16": bf16}, repeats=args.repeats)
    l32, l16 = forward(), bf16()
    target = x[:, 1:].reshape(-1)

    def ce(logits):
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target,
                                                 reduction="none")

    c32, c16 = ce(l32), ce(l16)
    top32, top16 = l32.argmax(-1), l16.argmax(-1)
    print(f"{args.model}: {x.shape[0]} x {x.shape[1]} tokens, {threads} thread(s); bfloat16 ran as: "
          f"{describe_precision(ran[-1])}")
    print(f"forward float32 {t['float32'] * 1e3:.0f} ms, bfloat16 products {t['bfloat16'] * 1e3:.0f} ms: "
          f"{t['float32'] / t['bfloat16']:.2f}x faster")
    print(f"max |logit difference| {float((l32 - l16).abs().max()):.3f}; top-1 unchanged on "
          f"{float((top32 == top16).float().mean()):.4f} of positions")
    print(f"mean cross-entropy {float(c32.mean()):.4f} vs {float(c16.mean()):.4f} nats "
          f"(mean per-token |difference| {float((c32 - c16).abs().mean()):.4f})")
    print(f"top-1 accuracy {float((top32[:, :-1].reshape(-1) == target).float().mean()):.4f} vs "
          f"{float((top16[:, :-1].reshape(-1) == target).float().mean()):.4f}")


if __name__ == "__main__":
    main()
