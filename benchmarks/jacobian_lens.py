"""The Jacobian lens' fit: its cost per prompt against one forward + backward of the same batch, its scaling in
prompts, and the logit and Jacobian lenses' cross-entropy per layer on held-out windows.

    .venv/bin/python benchmarks/jacobian_lens.py [--model smollm2-135m] [--corpus wiki-sample] [--seq-len 64]
                                                  [--skip-first 16] [--dim-batch 16] [--prompts 1,2,4]
                                                  [--eval-windows 8] [--threads 1]

Baseline: one forward of the prompt replicated ``dim_batch`` times and one backward of a random cotangent through
it — what training on that batch would cost. Fit: :func:`lens.readout.jacobian_fit.fit_sums` of that
prompt (one such forward and ``ceil(d_model / dim_batch)`` backwards), so the ratio is expected near
``(1 + ceil(d/B) · b) / (1 + b)`` with ``b`` a backward's cost in forwards. Both are timed as this process's CPU
time and as wall time (the baseline the median of 3 rounds after a warm-up; the fit one run). Scaling: :func:`fit_sums` on the first P prompts for
each P of ``--prompts`` (a line through the origin if the per-prompt cost is constant). CE: the logit lens and the
Jacobian lens fitted on the largest P, scored on ``--eval-windows`` other windows (every position but the last;
the tuned lens beside them comes from the tuned-lens study, ``lens study tuned-lens``, which scores all three on
the same held-out tokens).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lens  # noqa: E402
from lens.readout.jacobian_fit import StopForward, fit_sums, frozen_parameters, settings_for  # noqa: E402

from lens.readout.jacobian_lens import jacobian_lens_metrics  # noqa: E402
from lens.readout.logit_lens import logit_lens  # noqa: E402
from lens.text.corpora import load_corpus, make_windows  # noqa: E402


def timed(fn, rounds: int = 3) -> tuple[float, float]:
    """(median CPU s, median wall s) of ``rounds`` calls after one warm-up."""
    fn()
    cpu, wall = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return float(np.median(cpu)), float(np.median(wall))


def forward_backward(model, ids, B: int) -> None:
    """One forward of ``ids`` replicated B times up to the last block's output (the fit's graph) and one backward
    of a random cotangent through it."""
    last = model.layers[model.n_layers - 1]
    got = {}

    def stop(m, i, o):  # the fit's graph ends at the last block too (no final norm, no unembedding)
        got["y"] = o if torch.is_tensor(o) else o[0]
        raise StopForward

    h = last.register_forward_hook(stop)
    emb = model.hf_model.get_input_embeddings()
    try:
        with frozen_parameters(model.hf_model), torch.enable_grad():
            x = emb(torch.as_tensor(ids)[None].expand(B, -1)).detach().requires_grad_(True)
            try:
                model.hf_model(inputs_embeds=x, use_cache=False)
            except StopForward:
                pass
            torch.autograd.grad(got["y"], x, torch.randn_like(got["y"]))
    finally:
        h.remove()


def block_states(model, ids) -> dict:
    got = {}
    hs = [model.layers[i].register_forward_hook(
        lambda m, inp, o, i=i: got.__setitem__(i, (o if torch.is_tensor(o) else o[0])[0].detach()))
        for i in range(model.n_layers)]
    try:
        with torch.no_grad():
            model.hf_model(input_ids=torch.as_tensor(ids)[None], use_cache=False)
    finally:
        for h in hs:
            h.remove()
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="wiki-sample")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--skip-first", type=int, default=16)
    ap.add_argument("--dim-batch", type=int, default=16)
    ap.add_argument("--prompts", default="1,2,4")
    ap.add_argument("--eval-windows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    counts = sorted(int(p) for p in args.prompts.split(","))
    model = lens.load_model(args.model)
    n_win = counts[-1] + args.eval_windows
    w = make_windows(load_corpus(args.corpus), model.tokenizer, seq_len=args.seq_len,
                     max_tokens=n_win * args.seq_len, is_causal=True)
    wins = [x for x in w.input_ids if len(x) == args.seq_len]
    fit_w, eval_w = wins[: counts[-1]], wins[counts[-1]: counts[-1] + args.eval_windows]
    st = settings_for(model, skip_first=args.skip_first, max_seq_len=args.seq_len)
    print(f"{args.model}: {model.n_layers} layers, d_model {model.d_model}; prompts of {args.seq_len} tokens, "
          f"first {args.skip_first} skipped, dim_batch {args.dim_batch}, {args.threads} thread(s)")

    base_cpu, base_wall = timed(lambda: forward_backward(model, fit_w[0], args.dim_batch))
    print(f"one forward + backward of the {args.dim_batch} x {args.seq_len} batch: {base_cpu:.2f} s CPU "
          f"({base_wall:.2f} s wall)")
    sums = None
    for p in counts:  # the first count's run is the per-prompt cost (one run: a fit takes minutes on a CPU)
        c0, w0 = time.process_time(), time.perf_counter()
        sums = fit_sums(model, fit_w[:p], st, dim_batch=args.dim_batch)
        c, wl = time.process_time() - c0, time.perf_counter() - w0
        print(f"scaling: {p} prompt(s): {c:.1f} s CPU ({wl:.1f} s wall), {c / p:.1f} s CPU per prompt")
        if p == counts[0]:
            print(f"the fit per prompt against one forward + backward of the same batch: {c / p / base_cpu:.1f}x CPU, "
                  f"{wl / p / base_wall:.1f}x wall ({-(-model.d_model // args.dim_batch)} backwards of the batch)")

    jl = sums.lens()
    states = {l: [] for l in range(model.n_layers)}
    targets = []
    for ids in eval_w:
        got = block_states(model, ids)
        for l in states:
            states[l].append(got[l])
        targets.append(np.r_[ids[1:], -1])
    states = {l: torch.cat(v) for l, v in states.items()}
    nt = np.concatenate(targets)
    final = states[model.n_layers - 1]
    lo = logit_lens(model, states, final, nt)
    ja = jacobian_lens_metrics(model, jl, states, final, nt)
    print(f"CE per layer (nats) on {len(nt) - len(eval_w)} held-out tokens of {len(eval_w)} windows; Jacobian lens of "
          f"{jl.n_prompts} prompts")
    print("layer  logit   jacobian   KL logit  KL jacobian  top1 logit  top1 jacobian")
    for i, l in enumerate(lo.layers):
        print(f"{int(l):5d}  {lo.ce[i]:6.2f}  {ja.ce[i]:8.2f}   {lo.kl_to_final[i]:8.2f}  {ja.kl_to_final[i]:11.2f}  "
              f"{lo.top1_agreement[i]:10.2f}  {ja.top1_agreement[i]:13.2f}")


if __name__ == "__main__":
    main()
