"""Study: the model's loss when filler tokens are removed from its context, against removing as many
random tokens (the control), relative to the original text.

LLM-Microscope (Razzhigaev et al. 2025) report that removing "filler" tokens — punctuation,
determiners, stop words — degrades language-model performance although the tokens look irrelevant:
they carry context. Here every chunk of ``seq_len`` original tokens is scored three ways:
``original``; ``filler`` (tokens of ``classes`` removed, classified as in
:mod:`lens.text.token_classes` and :class:`lens.text.transforms.CorpusTransform` ``remove``); and
``random`` (the same number of tokens removed uniformly at random, ``n_random`` draws, as the
``remove-random`` transform does).

Which tokens are scored. Only tokens that survive *both* removals are scored, in all three
conditions, each from its own (shortened) prefix. Scoring "all remaining tokens" would confound
the comparison: filler removal deletes exactly the cheap tokens ("the", ",", "of" have low loss),
so the mean over what remains rises even if no context were lost, while random removal deletes a
mix. On a common set of tokens the only difference between conditions is the context each token
sees, which is the claim under test. Tokens at a sequence's first position (no prefix) are left
out. The all-remaining-token means are reported too (``loss_all_*``) to show the size of that
composition effect.

The judged number (issue #37) is the paper's comparison, removing fillers against the INTACT input, with
the removal in the context only: each chunk's first ``context_share`` is its context, where the fillers are
removed (``filler-ctx``), and the rest its continuation, left intact and scored in both conditions — the
same tokens, the same targets, only the context differs. ``delta_ctx_filler`` is the mean loss change of
the continuation's tokens, with a 95% interval resampling documents (chunks when there are fewer than 10:
:func:`studies.core.sampling.split_units`) and its value on nested subsamples (:mod:`studies.core.stability`).
The same number with as many random context tokens removed (``delta_ctx_random``, ``n_random`` draws) is
this project's control, not the paper's: reported beside it with the difference of the two, not judged.

No per-layer metrics (``layers`` is empty); the summary holds the losses, their differences with
95% bootstrap intervals over chunks, and the removed share.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from lens.errors import LensInputError
from lens.text.token_classes import TOKEN_CLASSES, token_classes
from studies.core.config import StudyConfig
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core import stability
from studies.core.sampling import split_units
from studies.core.stats import bootstrap_group_means
from studies.filler_tokens.declaration import A, CLAIMS, HEADLINES, RESULT, S
from lens.runtime.precision import describe_precision, forward_precision, resolve_precision
from lens.interventions.ablation import next_token_scores
from lens.text.corpora import load_corpus, make_windows

log = logging.getLogger(__name__)

CONDITIONS = ("original", "filler", "random")


@dataclass(frozen=True)
class Config(StudyConfig):
    """``classes``: token classes removed as filler; ``n_random``: random-removal draws averaged;
    ``n_boot``: bootstrap resamples of chunks (documents for the judged number) for the intervals;
    ``context_share``: the share of each chunk that is context, where tokens are removed for the judged
    number (the rest is the intact continuation it scores); ``precision`` of the forward passes
    (every condition alike): "auto" (bfloat16 matrix products with float32 accumulation where the CPU
    multiplies bfloat16 natively), "float32" or "bfloat16" (:func:`lens.runtime.precision.matmul_precision`);
    ``sample_tokens``: tokens scored, whole windows drawn over the corpus as a store's would be (``sample``), at
    most ``max_tokens`` (0 = ``max_tokens``)."""

    sample_tokens: int = 2000
    classes: tuple = ("punctuation", "determiner", "stopword")
    n_random: int = 3
    n_boot: int = 1000
    context_share: float = 0.5
    precision: str = "auto"


def check(config: Config) -> None:
    bad = [c for c in config.classes if c not in TOKEN_CLASSES]
    if bad or not config.classes:
        raise LensInputError(f"classes: expected some of {', '.join(TOKEN_CLASSES)}, got {list(config.classes)}")
    if config.n_random < 1:
        raise LensInputError(f"n_random: expected at least 1, got {config.n_random}")
    if not 0 < config.context_share < 1:
        raise LensInputError(f"context_share: expected a share strictly between 0 and 1, got {config.context_share}")

    resolve_precision(config.precision, config.device)


def needs(config: Config) -> Needs:
    return Needs(model=True, lm_head=True, causal=True)


def token_losses(model, seqs: list[np.ndarray], batch_size: int, progress: bool = False) -> list[np.ndarray]:
    """Per sequence, the loss of token j given tokens < j (NaN at j = 0), nats
    (:func:`lens.interventions.ablation.next_token_scores`, each sequence's next tokens as its targets)."""
    targets = [np.append(np.asarray(s[1:], dtype=np.int64), -1) for s in seqs]
    scores = next_token_scores(model, seqs, targets, batch_size=batch_size, progress=progress,
                               desc="filler-tokens losses")
    nll = -scores.logp
    cuts = np.cumsum([len(s) - 1 for s in seqs])[:-1]
    return [np.concatenate([[np.nan], part]) for part in np.split(nll, cuts)]


def _chunks(model, corpus, seq_len: int, max_tokens: int, sample: str = "spread",
            sample_seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """(chunks of at most ``seq_len`` token ids, the document of each): whole windows of the text as a capture
    would draw them (``sample``: spread over every document, or the first ``max_tokens`` tokens), without the
    special tokens (the study puts the BOS back before scoring) and of 8 tokens at least."""
    w = make_windows(corpus, model.tokenizer, seq_len=seq_len, max_tokens=max_tokens, is_causal=True,
                     min_window=8, sample=sample, sample_seed=sample_seed)
    off = w.window_offsets()
    ids, special, doc = (np.asarray(w.rows[k]) for k in ("token_id", "special", "doc"))
    out, docs = [], []
    for i in range(w.n_windows):
        a, b = off[i], off[i + 1]
        c = ids[a:b][~special[a:b]]
        if len(c) >= 8:
            out.append(c)
            docs.append(int(doc[a]))
    return out, np.asarray(docs, np.int64)


def context_keeps(is_filler: np.ndarray, n_ctx: int, n_random: int, rng) -> tuple[np.ndarray, list[np.ndarray]]:
    """Keep-masks of a chunk for the judged comparison: fillers removed from its first ``n_ctx`` tokens (the
    context) only; and ``n_random`` draws removing as many random context tokens. The continuation is kept."""
    ctx_fill = is_filler.copy()
    ctx_fill[n_ctx:] = False
    n_drop = int(ctx_fill.sum())
    draws = []
    for _ in range(n_random):
        drop = np.zeros(len(is_filler), bool)
        drop[rng.choice(n_ctx, size=n_drop, replace=False)] = True
        draws.append(~drop)
    return ~ctx_fill, draws


def continuation_losses(losses: np.ndarray, n_cont: int) -> np.ndarray:
    """The losses of the last ``n_cont`` tokens of a scored sequence (its intact continuation)."""
    return np.asarray(losses[len(losses) - n_cont:], float)


def delta_stats(delta_sums: np.ndarray, counts: np.ndarray, units: np.ndarray, n_boot: int, seed: int,
                key: str | None = None) -> dict:
    """(mean, low, high) of a per-chunk summed loss change over the chunks' scored tokens, the interval
    resampling whole ``units`` (one per chunk); with ``key``, also its nested-subsample record."""
    codes = np.unique(units, return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1
    sums, cnt = np.bincount(codes, weights=delta_sums, minlength=G), np.bincount(codes, weights=counts, minlength=G)
    lo, hi = bootstrap_group_means(sums, cnt, n_boot, seed)
    out = {"value": float(sums.sum() / cnt.sum()), "low": float(lo), "high": float(hi)}
    if key:
        def stat(mask):
            c = float(counts[mask].sum())
            if c <= 0:
                raise ValueError("no scored token in this subsample")
            return float(delta_sums[mask].sum()) / c
        values, _ = stability.nested_values(stat, codes, seed)
        tokens = [int(counts[m].sum()) for m in stability.nested_units(codes, seed)]  # scored tokens, not chunks
        out["nested"] = stability.record(key, values, tokens)
    return out


def _bos(model) -> list[int]:
    tok = model.tokenizer
    bos = getattr(tok, "bos_token_id", None)
    return [bos] if bos is not None and getattr(tok, "add_bos_token", False) else []


def _scored(losses: np.ndarray, keep: np.ndarray, pre: int) -> np.ndarray:
    """Original-index losses of a reduced sequence: NaN where the token was removed."""
    full = np.full(len(keep), np.nan)
    full[keep] = losses[pre:]
    return full


def compute(config: Config, inputs: Inputs) -> StudyResult:
    model = inputs.model
    budget = min(n for n in (config.sample_tokens, config.max_tokens) if n) if config.sample_tokens else config.max_tokens
    chunks, chunk_doc = _chunks(model, load_corpus(config.corpus), config.seq_len, budget,
                                config.sample, config.sample_seed)
    if not chunks:
        raise LensInputError(f"corpus {config.corpus!r} has no document of 8+ tokens to score")
    pre = _bos(model)
    rng = np.random.default_rng(config.seed)
    filler_keep, random_keeps, ctx_filler_keep, ctx_random_keeps, n_ctx = [], [], [], [], []
    for c in chunks:
        is_filler = np.isin(token_classes([model.tokenizer.decode([int(i)]) for i in c]), list(config.classes))
        filler_keep.append(~is_filler)
        draws = []
        for _ in range(config.n_random):
            drop = np.zeros(len(c), bool)
            drop[rng.choice(len(c), size=int(is_filler.sum()), replace=False)] = True
            draws.append(~drop)
        random_keeps.append(draws)
        n_ctx.append(min(len(c) - 1, max(1, int(round(config.context_share * len(c))))))
    ctx_rng = np.random.default_rng(config.seed + 2)  # its own stream: the older conditions draw as before
    for c, keep, k in zip(chunks, filler_keep, n_ctx):
        kf, kr = context_keeps(~keep, k, config.n_random, ctx_rng)
        ctx_filler_keep.append(kf)
        ctx_random_keeps.append(kr)
    seqs = [np.concatenate([pre, c]).astype(np.int64) for c in chunks]
    seqs += [np.concatenate([pre, c[k]]).astype(np.int64) for c, k in zip(chunks, filler_keep)]
    seqs += [np.concatenate([pre, c[k]]).astype(np.int64) for c, ks in zip(chunks, random_keeps) for k in ks]
    seqs += [np.concatenate([pre, c[k]]).astype(np.int64) for c, k in zip(chunks, ctx_filler_keep)]
    seqs += [np.concatenate([pre, c[k]]).astype(np.int64) for c, ks in zip(chunks, ctx_random_keeps) for k in ks]

    with forward_precision(config.precision, model) as precision:
        losses = token_losses(model, seqs, config.batch_size, config.progress)
    n = len(chunks)
    per = {c: [] for c in CONDITIONS}
    all_means = {c: [] for c in CONDITIONS}
    for i, c in enumerate(chunks):
        orig = _scored(losses[i], np.ones(len(c), bool), len(pre))
        fil = _scored(losses[n + i], filler_keep[i], len(pre))
        rnd_draws = [_scored(losses[2 * n + i * config.n_random + r], k, len(pre))
                     for r, k in enumerate(random_keeps[i])]
        for rnd in rnd_draws:
            common = np.isfinite(orig) & np.isfinite(fil) & np.isfinite(rnd)
            for cond, values in zip(CONDITIONS, (orig, fil, rnd)):
                per[cond].append(values[common])
        all_means["original"].append(orig[np.isfinite(orig)])
        all_means["filler"].append(fil[np.isfinite(fil)])
        all_means["random"].extend(r[np.isfinite(r)] for r in rnd_draws)
    counts = np.array([len(a) for a in per["original"]], dtype=float)
    if counts.sum() == 0:
        raise LensInputError("no token survives both removals; use longer texts or fewer filler classes")
    mean = {k: float(np.concatenate(v).mean()) for k, v in per.items()}
    summary = {S.loss_original: mean["original"], S.loss_filler: mean["filler"], S.loss_random: mean["random"],
               S.delta_loss_filler: mean["filler"] - mean["original"],
               S.delta_loss_random: mean["random"] - mean["original"],
               S.n_scored: int(counts.sum() / config.n_random), S.n_chunks: n,
               S.removed_share: float(np.mean(np.concatenate([~k for k in filler_keep]))),
               S.precision: describe_precision(precision, model.dtype),
               **{S.loss_all(k): float(np.concatenate(v).mean()) for k, v in all_means.items()}}
    summary[S.filler_minus_random] = summary[S.delta_loss_filler] - summary[S.delta_loss_random]
    for cond, low, high in (("filler", S.delta_loss_filler_ci_low, S.delta_loss_filler_ci_high),
                            ("random", S.delta_loss_random_ci_low, S.delta_loss_random_ci_high)):
        d = np.array([(a - b).sum() for a, b in zip(per[cond], per["original"])])  # per-chunk loss change, summed
        lo, hi = bootstrap_group_means(d, counts, config.n_boot, config.seed + 1)
        summary[low], summary[high] = float(lo), float(hi)
    arrays = {name: np.array([(a - b).mean() if len(a) else np.nan for a, b in zip(per[cond], per["original"])])
              for name, cond in ((A.chunk_delta_filler, "filler"), (A.chunk_delta_random, "random"))}
    summary.update(_judged(config, chunks, chunk_doc, n_ctx, ctx_filler_keep, losses, n))
    log.info("filler-tokens: Δ filler %.3f, Δ random %.3f nats (context only, intact continuation: %.3f, %.3f)",
             summary[S.delta_loss_filler], summary[S.delta_loss_random], summary[S.delta_ctx_filler],
             summary[S.delta_ctx_random])
    return StudyResult(model=model.model_id, corpus=config.corpus, n_tokens=int(sum(len(c) for c in chunks)),
                       layers=[], summary=summary, arrays=arrays)


def _judged(config: Config, chunks, chunk_doc, n_ctx, ctx_filler_keep, losses, n: int) -> dict:
    """The judged comparison: per chunk, the loss change of its intact continuation with fillers (and, our
    control, random tokens) removed from its context; intervals resample documents (chunks when fewer)."""
    R = config.n_random
    base = 2 * n + n * R  # where the context-only sequences start in ``losses``
    d_fill, d_rand, counts, orig_sum = [], [], [], []
    for i, c in enumerate(chunks):
        n_cont = len(c) - n_ctx[i]
        orig = continuation_losses(losses[i], n_cont)
        fil = continuation_losses(losses[base + i], n_cont)
        rnd = [continuation_losses(losses[base + n + i * R + r], n_cont) for r in range(R)]
        ok = np.isfinite(orig) & np.isfinite(fil) & np.all([np.isfinite(x) for x in rnd], axis=0)
        counts.append(int(ok.sum()))
        orig_sum.append(float(orig[ok].sum()))
        d_fill.append(float((fil - orig)[ok].sum()))
        d_rand.append(float(np.mean([(x - orig)[ok].sum() for x in rnd])))
    counts, d_fill, d_rand = np.asarray(counts, float), np.asarray(d_fill), np.asarray(d_rand)
    if counts.sum() == 0:
        raise LensInputError("no continuation token could be scored; use longer texts")
    units, kind = split_units({"doc": chunk_doc, "window": np.arange(len(chunks))})
    seed = config.seed + 3
    fill = delta_stats(d_fill, counts, units, config.n_boot, seed, key=S.delta_ctx_filler)
    rand = delta_stats(d_rand, counts, units, config.n_boot, seed)
    diff = delta_stats(d_fill - d_rand, counts, units, config.n_boot, seed)
    removed = np.concatenate([~k[:m] for k, m in zip(ctx_filler_keep, n_ctx)])
    out = {S.loss_cont_original: float(np.sum(orig_sum) / counts.sum()),
           S.delta_ctx_filler: fill["value"], S.delta_ctx_filler_low: fill["low"], S.delta_ctx_filler_high: fill["high"],
           S.delta_ctx_random: rand["value"], S.delta_ctx_random_low: rand["low"], S.delta_ctx_random_high: rand["high"],
           S.ctx_filler_minus_random: diff["value"], S.ctx_filler_minus_random_low: diff["low"],
           S.ctx_filler_minus_random_high: diff["high"], S.n_cont_scored: int(counts.sum()),
           S.ctx_removed_share: float(removed.mean()), S.units: kind, S.n_units: int(len(np.unique(units))),
           **fill["nested"]}
    return out


def figures(result: StudyResult, config: Config) -> dict:
    s = result.summary
    groups = (("removed from the context; intact continuation scored (judged)",
               ((S.delta_ctx_filler, S.delta_ctx_filler_low, S.delta_ctx_filler_high),
                (S.delta_ctx_random, S.delta_ctx_random_low, S.delta_ctx_random_high))),
              ("removed everywhere; tokens kept by both scored (older measure)",
               ((S.delta_loss_filler, S.delta_loss_filler_ci_low, S.delta_loss_filler_ci_high),
                (S.delta_loss_random, S.delta_loss_random_ci_low, S.delta_loss_random_ci_high))))
    fig = go.Figure()
    for name, rows in groups:
        if any(s.get(d) is None for d, _, _ in rows):
            continue  # a result from before the context-only comparison
        fig.add_trace(go.Bar(x=["fillers removed", "random tokens removed (our control)"], y=[s[d] for d, _, _ in rows],
                             name=name, error_y=dict(type="data", symmetric=False,
                                                     array=[s[hi] - s[d] for d, _, hi in rows],
                                                     arrayminus=[s[d] - s[lo] for d, lo, _ in rows])))
    fig.update_layout(title=f"Loss change when fillers are removed — {result.model} "
                            f"(original {s[S.loss_original]:.3f} nats; {s[S.removed_share]:.0%} removed)",
                      xaxis_title="tokens removed", yaxis_title="Δ loss vs the intact text (nats/token)", barmode="group",
                      template="plotly_white")
    return {"main": fig}


STUDY = Study(
    cost=30,  # nine forward passes per chunk of 2000 tokens (issue #38; 150 s at the main job's 20000)
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
