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

No per-layer metrics (``layers`` is empty); the summary holds the losses, their differences with
95% bootstrap intervals over chunks, and the removed share.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from lens.errors import LensInputError
from lens.text.token_classes import TOKEN_CLASSES, token_classes
from studies.config import StudyConfig
from studies.contract import Inputs, Needs, Study, StudyResult
from studies.stats import bootstrap_group_means
from studies.declarations.filler_tokens import A, CLAIMS, HEADLINES, RESULT, S

log = logging.getLogger(__name__)

CONDITIONS = ("original", "filler", "random")


@dataclass(frozen=True)
class Config(StudyConfig):
    """``classes``: token classes removed as filler; ``n_random``: random-removal draws averaged;
    ``n_boot``: bootstrap resamples of chunks for the intervals; ``precision`` of the forward passes
    (every condition alike): "auto" (bfloat16 matrix products with float32 accumulation where the CPU
    multiplies bfloat16 natively), "float32" or "bfloat16" (:func:`lens.runtime.precision.matmul_precision`)."""

    max_tokens: int = 4000
    classes: tuple = ("punctuation", "determiner", "stopword")
    n_random: int = 3
    n_boot: int = 1000
    precision: str = "auto"


def check(config: Config) -> None:
    bad = [c for c in config.classes if c not in TOKEN_CLASSES]
    if bad or not config.classes:
        raise LensInputError(f"classes: expected some of {', '.join(TOKEN_CLASSES)}, got {list(config.classes)}")
    if config.n_random < 1:
        raise LensInputError(f"n_random: expected at least 1, got {config.n_random}")
    from lens.runtime.precision import resolve_precision

    resolve_precision(config.precision, config.device)


def needs(config: Config) -> Needs:
    return Needs(model=True, lm_head=True, causal=True)


def token_losses(model, seqs: list[np.ndarray], batch_size: int, progress: bool = False) -> list[np.ndarray]:
    """Per sequence, the loss of token j given tokens < j (NaN at j = 0), nats
    (:func:`lens.interventions.ablation.next_token_scores`, each sequence's next tokens as its targets)."""
    from lens.interventions.ablation import next_token_scores

    targets = [np.append(np.asarray(s[1:], dtype=np.int64), -1) for s in seqs]
    scores = next_token_scores(model, seqs, targets, batch_size=batch_size, progress=progress,
                               desc="filler-tokens losses")
    nll = -scores.logp
    cuts = np.cumsum([len(s) - 1 for s in seqs])[:-1]
    return [np.concatenate([[np.nan], part]) for part in np.split(nll, cuts)]


def _chunks(model, corpus, seq_len: int, max_tokens: int) -> list[np.ndarray]:
    out, total = [], 0
    from lens.text.corpora import document_ids

    for doc in corpus.documents:  # a long document is tokenised only as far as max_tokens reaches
        ids = document_ids(model.tokenizer, doc, max(0, max_tokens - total) + 1)
        for start in range(0, len(ids), seq_len):
            c = ids[start:start + seq_len]
            if len(c) < 8 or total >= max_tokens:
                continue
            c = c[:max_tokens - total]
            out.append(c)
            total += len(c)
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
    from lens.text.corpora import load_corpus

    model = inputs.model
    chunks = _chunks(model, load_corpus(config.corpus), config.seq_len, config.max_tokens)
    if not chunks:
        raise LensInputError(f"corpus {config.corpus!r} has no document of 8+ tokens to score")
    pre = _bos(model)
    rng = np.random.default_rng(config.seed)
    filler_keep, random_keeps = [], []
    for c in chunks:
        is_filler = np.isin(token_classes([model.tokenizer.decode([int(i)]) for i in c]), list(config.classes))
        filler_keep.append(~is_filler)
        draws = []
        for _ in range(config.n_random):
            drop = np.zeros(len(c), bool)
            drop[rng.choice(len(c), size=int(is_filler.sum()), replace=False)] = True
            draws.append(~drop)
        random_keeps.append(draws)
    seqs = [np.concatenate([pre, c]).astype(np.int64) for c in chunks]
    seqs += [np.concatenate([pre, c[k]]).astype(np.int64) for c, k in zip(chunks, filler_keep)]
    seqs += [np.concatenate([pre, c[k]]).astype(np.int64) for c, ks in zip(chunks, random_keeps) for k in ks]
    from lens.runtime.precision import describe_precision, forward_precision

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
    log.info("filler-tokens: Δ filler %.3f, Δ random %.3f nats", summary[S.delta_loss_filler],
             summary[S.delta_loss_random])
    return StudyResult(model=model.model_id, corpus=config.corpus, n_tokens=int(sum(len(c) for c in chunks)),
                       layers=[], summary=summary, arrays=arrays)


def figures(result: StudyResult, config: Config) -> dict:
    import plotly.graph_objects as go

    s = result.summary
    rows = ((S.delta_loss_filler, S.delta_loss_filler_ci_low, S.delta_loss_filler_ci_high),
            (S.delta_loss_random, S.delta_loss_random_ci_low, S.delta_loss_random_ci_high))
    fig = go.Figure(go.Bar(x=["filler removed", "random removed (control)"], y=[s[d] for d, _, _ in rows],
                           error_y=dict(type="data", symmetric=False, array=[s[hi] - s[d] for d, _, hi in rows],
                                        arrayminus=[s[d] - s[lo] for d, lo, _ in rows])))
    fig.update_layout(title=f"Loss change on tokens kept by both removals — {result.model} "
                            f"(original {s[S.loss_original]:.3f} nats; {s[S.removed_share]:.0%} removed)",
                      yaxis_title="Δ loss vs original (nats/token)", template="plotly_white")
    return {"main": fig}


STUDY = Study(
    cost=82,
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
