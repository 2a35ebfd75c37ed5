"""Logit lens over all layers against L × one unembedding of the same tokens, and its peak memory.

    .venv/bin/python benchmarks/logit_lens.py [--model smollm2-135m] [--tokens 2048] [--chunk-size 512] [--repeats 3]
                                              [--threads N]

Baseline: for each of the L layers, ``model.decode`` (final norm + unembedding) of the same tokens
in the same chunks, nothing else. Lens: :func:`lens.readout.logit_lens.logit_lens` (CE, KL to the last
layer, top-1, entropy, rank, per-token arrays; the last layer decoded once more per chunk as the
reference), with the per-row statistics fused by torch.compile (the CPU default for large jobs;
the warm-up run pays the compilation) and, for comparison, as eager torch ops. Goal: lens / baseline ≤ 1.3×.
The three run round-robin (``--repeats`` rounds after a warm-up) and each ratio is printed from the
medians of the same rounds, as wall time and as this process's CPU time: on a shared machine the
CPU time is the steadier of the two (other processes stretch the wall time of small multi-threaded
operations far more than a large matmul's); ``--threads`` sets torch's pool for the run.
Memory: peak RSS above the states while the lens runs
(sampled every 5 ms with psutil; torch's CPU allocations are invisible to tracemalloc, which is
reported too for the Python side), next to the chunk bound (chunk × d_vocab × 4 bytes per buffer)
and to what layers × tokens × d_vocab logits would take; run at two chunk sizes to show the peak
follows the chunk, not the token count.
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lens  # noqa: E402
from benchmarks.common import PeakRSS, timed_rounds  # noqa: E402
from lens.readout.logit_lens import decode_chunked, logit_lens  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="wiki-sample")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk-size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: as configured)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = lens.load_model(args.model)
    store = lens.capture(model, corpus=args.corpus, sites=["resid_post"], max_tokens=args.tokens, progress=False)
    L, V, n = model.n_layers, model.d_vocab, store.n_tokens
    states = {l: store.get(layer=l) for l in range(L)}
    final, nt = states[L - 1], store.tokens["next_token_id"]
    cs = args.chunk_size

    def baseline():
        for l in range(L):
            for _ in decode_chunked(model, states[l], chunk_size=cs):
                pass

    def lens_with(fused):
        return lambda: logit_lens(model, states, final, nt, chunk_size=cs, top_k=10,
                                  topk_rows=np.arange(min(256, n)), fused=fused)

    wall, cpu = timed_rounds({"baseline": baseline, "lens": lens_with(True), "lens_eager": lens_with(False)},
                             repeats=args.repeats)
    print(f"{args.model}: {L} layers, {n} tokens, d_vocab {V}, chunk {cs}, torch threads {torch.get_num_threads()}, "
          f"{args.repeats} interleaved rounds (medians)")
    print(f"{'':28}{'wall s':>9}{'ratio':>8}{'cpu s':>9}{'ratio':>8}")
    for key, name in (("baseline", "L x one unembedding"), ("lens", "logit lens, fused kernel"),
                      ("lens_eager", "logit lens, eager torch ops")):
        print(f"{name:<28}{wall[key]:9.2f}{wall[key] / wall['baseline']:7.2f}x{cpu[key]:9.2f}"
              f"{cpu[key] / cpu['baseline']:7.2f}x")
    print("goal: logit lens / (L x one unembedding) <= 1.3x")

    for chunk in (cs // 4, cs):
        tracemalloc.start()
        with PeakRSS() as mem:
            logit_lens(model, states, final, nt, chunk_size=chunk, top_k=10, topk_rows=np.arange(min(256, n)))
        _, py_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        bound = chunk * V * 4 / 2**20
        print(f"chunk {chunk:>5}: peak RSS above states {mem.delta_mb:8.1f} MB "
              f"(one chunk x vocab fp32 buffer {bound:.1f} MB; tracemalloc Python peak {py_peak / 2**20:.1f} MB)")
    print(f"for scale: layers x tokens x vocab logits would be {L * n * V * 4 / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
