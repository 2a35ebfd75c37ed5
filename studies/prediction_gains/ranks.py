"""Prediction gains' judged fit over a store's shards by N processes under torchrun (issue #40).

He & Su's recipe (:class:`probes.token_id_pr.TokenIdPR`) needs per-group sums only — n, Σx, the Gram Σxxᵀ, Σxt,
Σt, Σt² of every layer's freshly normed states — so N ranks each read the store's shards ``i`` with
``i % N == rank`` (:func:`shard_rows`), sum their rows' moments per jackknife group, and add them up with
``torch.distributed.all_reduce`` (gloo on a CPU, NCCL where the ranks hold GPUs; the sums stay float64 on the
CPU here, so gloo). Every rank then fits on the totals; rank 0 writes the result. The groups, the nested
subsamples and the targets come from the token table, which every rank reads whole (it is small), so they are
the single process's: the result equals :func:`studies.prediction_gains.study.token_id_fit` on one process up
to the order of float64 additions (tests/studies/per_study/test_pred_gains_ranks.py states the bound).

Run it as ``python -m torch.distributed.run --nproc-per-node N -m studies.prediction_gains.ranks --store S --out
result.json`` (``--site``, ``--norm``, ``--jackknife-groups``, ``--seed``, ``--split-by`` as the study's config).
Bad input (no store, an unknown site): one line on stderr, exit 2, on every rank.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lens.errors import LensInputError
from lens.runtime.atomic import write_json_file
from probes.token_id_pr import RowShare
from studies.core.config import resolve_norm
from studies.prediction_gains.study import Config, fit_targets, token_id_fit
from lens.store.reader import open_store


def shard_rows(manifest: dict, rank: int, world: int) -> np.ndarray:
    """Boolean mask over the store's rows: the rows of its shards ``i`` with ``i % world == rank``."""
    sizes = [int(s["n_tokens"]) for s in manifest["shards"]]
    owner = np.repeat(np.arange(len(sizes)) % world, sizes)
    return owner == rank


def all_reduce_sum(a: np.ndarray) -> np.ndarray:
    """Element-wise float64 sum over every rank (``torch.distributed.all_reduce``)."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.numpy()


def fit(config: Config, store, share: RowShare | None = None):
    """The judged token-id fit of ``config`` on ``store``, this process reading ``share`` of its rows (None: all)."""
    norm, _ = resolve_norm(config.norm, store.card)
    next_ids, units, _ = fit_targets(config, store)
    return token_id_fit(config, store, norm, next_ids, units, share)


def result_record(res, world: int) -> dict:
    """What rank 0 writes: the fit's numbers, JSON-ready."""
    def num(v):
        return None if v is None or not np.isfinite(v) else float(v)

    return {"pr_token_id": [num(v) for v in res.pr], "pearson_r_token_id": num(res.summary.pearson_r),
            "pearson_r_token_id_low": num(res.pearson_interval[0]),
            "pearson_r_token_id_high": num(res.pearson_interval[1]),
            "nested_r": [num(v) for v in res.nested_r], "nested_n": list(res.nested_n),
            "n_tokens": res.n_tokens, "n_groups": res.n_groups, "layers": [int(l) for l in res.layers],
            "world_size": world}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.prediction_gains.ranks",
                                description="prediction gains' token-id fit over a store's shards by torchrun ranks")
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True, help="result JSON written by rank 0")
    p.add_argument("--site", default=Config.site.value)
    p.add_argument("--norm", default=Config.norm)
    p.add_argument("--split-by", default=Config.split_by)
    p.add_argument("--jackknife-groups", type=int, default=Config.jackknife_groups)
    p.add_argument("--seed", type=int, default=Config.seed)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    launched = world > 1
    if launched:
        dist.init_process_group("gloo")
    try:
        try:
            config = Config(site=args.site, norm=args.norm, split_by=args.split_by,
                            jackknife_groups=args.jackknife_groups, seed=args.seed, progress=False)
            if not Path(args.store).is_dir():
                raise LensInputError(f"--store: no store at {args.store}")
            store = open_store(args.store, verify=False)
            share = RowShare(shard_rows(store.manifest, rank, world), all_reduce_sum) if launched else None
            res = fit(config, store, share)
        except LensInputError as exc:  # every rank reads the same input: each refuses it the same way
            if rank == 0:
                print(f"lens: error: {exc}", file=sys.stderr)
            return 2
        if rank == 0:
            write_json_file(Path(args.out), result_record(res, world))
        return 0
    finally:
        if launched:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
