"""``lens jlens fit`` and ``lens jlens merge``: the Jacobian lens (:mod:`lens.readout.jacobian_lens`) fitted on a
corpus' windows, whole, by ``--part I/N``, by torchrun ranks (summed with ``torch.distributed``, rank 0 writes) or
by a Slurm array's tasks (each writes ``OUT.parts/part-I-of-N.safetensors``; ``lens jlens merge`` joins them)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from app.commands.flags import Parser, add_model_args, describe_commands, device_arg, load_model_from_args
from lens.errors import LensInputError

SKIP_FIRST = 16  # lens.readout.jacobian_lens.SKIP_FIRST (the reference's); this module does not import torch
MAX_SEQ_LEN = 128


def add_parsers(sub) -> None:
    jl = sub.add_parser("jlens", help="fit, merge the parts of, a Jacobian lens (Gurnee et al. 2026)")
    jsub = jl.add_subparsers(dest="jlens_command", required=True, parser_class=Parser)
    fit = jsub.add_parser("fit", help="fit J_l = mean d h_final / d h_l on a corpus' windows")
    fit.add_argument("model", help="alias, Hugging Face id, model folder or .gguf file")
    fit.add_argument("--corpus", default="wiki-sample", help="wiki-sample, lee, or a .txt / .jsonl file")
    fit.add_argument("--prompts", type=int, default=64, help="windows (prompts) to average over")
    fit.add_argument("--seq-len", type=int, default=MAX_SEQ_LEN, help="tokens per prompt (BOS included)")
    fit.add_argument("--skip-first", type=int, default=SKIP_FIRST,
                     help="leading positions left out of the average (attention sinks)")
    fit.add_argument("--dim-batch", type=int, default=8, help="output dimensions per backward pass")
    fit.add_argument("--sample", default="spread", choices=("spread", "first"),
                     help="which windows: spread over every document, or the documents in order")
    fit.add_argument("--sample-seed", type=int, default=0, help="seed of a spread sample")
    fit.add_argument("--part", default=None, metavar="I/N",
                     help="fit only part I of N of the prompts; join the parts with `lens jlens merge`. Under "
                          "torchrun the ranks are summed and rank 0 writes OUT; a Slurm array's tasks write "
                          "OUT.parts/part-I-of-N.safetensors")
    fit.add_argument("--out", required=True, help="the lens file (.safetensors)")
    fit.add_argument("--device", default=None, type=device_arg, help="cpu or cuda (default: cpu; a rank's GPU)")
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(fit)
    mrg = jsub.add_parser("merge", help="add the parts of a Jacobian lens fitted with --part I/N")
    mrg.add_argument("parts", nargs="+", help="the part files (any order)")
    mrg.add_argument("--out", required=True, help="the merged lens file")
    describe_commands(jsub)


def _cmd_jlens(args):
    return {"fit": _cmd_fit, "merge": _cmd_merge}[args.jlens_command](args)


def prompt_windows(model, corpus: str, n_prompts: int, seq_len: int, sample: str, sample_seed: int) -> list:
    """The first ``n_prompts`` windows of ``seq_len`` tokens the corpus gives (the same list on every rank)."""
    from lens.text.corpora import load_corpus, make_windows

    if n_prompts < 1:
        raise LensInputError(f"--prompts must be >= 1; got {n_prompts}")
    w = make_windows(load_corpus(corpus), model.tokenizer, seq_len=seq_len, max_tokens=n_prompts * seq_len,
                     is_causal=model.is_causal, sample=sample, sample_seed=sample_seed)
    return list(w.input_ids[:n_prompts])


def _cmd_fit(args):
    from lens.capturing.launch import TORCHRUN, launch_context, rank_device
    from lens.readout.jacobian_fit import fit_sums, fitted_digests, settings_for

    t0 = time.time()
    out = Path(args.out)
    ctx = launch_context(part=args.part)
    if not out.parent.is_dir():
        raise LensInputError(f"cannot write {out}: folder {out.parent} does not exist")
    device = rank_device(ctx, args.device)
    model = load_model_from_args(args, device)
    settings = settings_for(model, skip_first=args.skip_first, max_seq_len=args.seq_len)
    prompts = prompt_windows(model, args.corpus, args.prompts, args.seq_len, args.sample, args.sample_seed)
    sums = fit_sums(model, prompts, settings, dim_batch=args.dim_batch, part=ctx.part, corpus=args.corpus,
                    progress=not args.quiet)
    if ctx.launcher == TORCHRUN and ctx.part is not None:
        import torch.distributed as dist

        from lens.readout.jacobian_fit import all_reduce

        dist.init_process_group("nccl" if str(device).startswith("cuda") else "gloo", timeout=timedelta(hours=24))
        try:
            sums = all_reduce(sums, fitted_digests(prompts, settings))
            if ctx.leader:
                sums.save(out)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        if ctx.leader:
            print(f"fitted a Jacobian lens of {model.model_id} on {sums.n_prompts} prompts ({ctx.world_size} torchrun "
                  f"ranks summed) into {out} ({time.time() - t0:.1f} s)")
        return
    where = out
    if ctx.launcher and ctx.part is not None:  # a Slurm array task: its own part file, merged afterwards
        where = out.with_name(out.name + ".parts") / f"part-{ctx.part.index}-of-{ctx.part.count}.safetensors"
        os.makedirs(where.parent, exist_ok=True)
    sums.save(where)
    part = f" (part {ctx.part.label}: join the parts with `lens jlens merge`)" if ctx.part else ""
    print(f"fitted a Jacobian lens of {model.model_id} on {sums.n_prompts} prompts into {where}{part} "
          f"({time.time() - t0:.1f} s)")


def _cmd_merge(args):
    from lens.readout.jacobian_lens import JacobianSums, merge_sums, missing_parts

    parts = [JacobianSums.load(p) for p in args.parts]
    merged = merge_sums(parts, args.parts)
    missing = missing_parts(merged)
    if missing:
        raise LensInputError(f"parts {missing} are missing: give every part of the split")
    merged.save(args.out)
    print(f"merged {len(parts)} parts ({merged.n_prompts} prompts) into {args.out}")


COMMANDS = {"jlens": _cmd_jlens}
