"""Study: the model's loss when filler tokens are removed from its context, against removing as many
random tokens (the control), relative to the original text.

LLM-Microscope (Razzhigaev et al. 2025) report that removing "filler" tokens — punctuation,
determiners, stop words — degrades language-model performance although the tokens look irrelevant:
they carry context. Here every chunk of ``seq_len`` original tokens is scored three ways:
``original``; ``filler`` (tokens of ``classes`` removed, classified as in
:mod:`lens.token_classes` and :class:`lens.transforms.CorpusTransform` ``remove``); and
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

Summary: ``loss_original``, ``loss_filler``, ``loss_random`` (nats/token on the common tokens),
``delta_loss_filler`` = filler − original, ``delta_loss_random`` = random − original, 95%
bootstrap intervals over chunks (``*_ci_low``/``*_ci_high``), ``removed_share``, ``n_scored``.
No per-layer metrics (``layers`` is empty).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from tqdm.auto import tqdm

from lens.token_classes import TOKEN_CLASSES, token_classes
from lens.corpora import load_corpus
from lens.errors import LensInputError
from studies.common import StudyConfig, bootstrap_group_means, cached_model
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "filler-tokens"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``classes``: token classes removed as filler; ``n_random``: random-removal draws averaged;
    ``n_boot``: bootstrap resamples of chunks for the intervals."""

    max_tokens: int = 4000
    classes: tuple = ("punctuation", "determiner", "stopword")
    n_random: int = 3
    n_boot: int = 1000


@torch.inference_mode()
def token_losses(model, seqs: list[np.ndarray], batch_size: int, progress: bool = False) -> list[np.ndarray]:
    """Per sequence, the loss of token j given tokens < j (NaN at j = 0), nats."""
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    out: list[np.ndarray] = []
    for lo in tqdm(range(0, len(seqs), batch_size), desc="filler-tokens losses", disable=not progress):
        chunk = seqs[lo:lo + batch_size]
        width = max(len(s) for s in chunk)
        x = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(x)
        for i, s in enumerate(chunk):
            x[i, :len(s)] = torch.as_tensor(s)
            mask[i, :len(s)] = 1
        logits = model.hf_model(input_ids=x.to(model.device), attention_mask=mask.to(model.device),
                                use_cache=False).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll = -lp.gather(-1, x[:, 1:, None].to(lp.device))[..., 0].cpu().numpy()
        for i, s in enumerate(chunk):
            out.append(np.concatenate([[np.nan], nll[i, :len(s) - 1]]))
    return out


def _chunks(model, corpus, seq_len: int, max_tokens: int) -> list[np.ndarray]:
    out, total = [], 0
    for doc in corpus.documents:
        ids = np.asarray(model.tokenizer(doc.text, add_special_tokens=False)["input_ids"], dtype=np.int64)
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


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    bad = [c for c in config.classes if c not in TOKEN_CLASSES]
    if bad or not config.classes:
        raise LensInputError(f"classes: expected some of {', '.join(TOKEN_CLASSES)}, got {list(config.classes)}")
    if config.n_random < 1:
        raise LensInputError(f"n_random: expected at least 1, got {config.n_random}")
    model = cached_model(config.model, config.device)
    if not model.is_causal or not model.has_lm_head:
        raise LensInputError(f"filler-tokens needs a causal language model, got {model.model_id} (an encoder)")
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
    losses = token_losses(model, seqs, config.batch_size, config.progress)
    n = len(chunks)
    per = {"original": [], "filler": [], "random": []}
    all_means = {"original": [], "filler": [], "random": []}
    for i, c in enumerate(chunks):
        orig = _scored(losses[i], np.ones(len(c), bool), len(pre))
        fil = _scored(losses[n + i], filler_keep[i], len(pre))
        rnd_draws = [_scored(losses[2 * n + i * config.n_random + r], k, len(pre))
                     for r, k in enumerate(random_keeps[i])]
        for r, rnd in enumerate(rnd_draws):
            common = np.isfinite(orig) & np.isfinite(fil) & np.isfinite(rnd)
            per["original"].append(orig[common])
            per["filler"].append(fil[common])
            per["random"].append(rnd[common])
        all_means["original"].append(orig[np.isfinite(orig)])
        all_means["filler"].append(fil[np.isfinite(fil)])
        all_means["random"].extend(r[np.isfinite(r)] for r in rnd_draws)
    counts = np.array([len(a) for a in per["original"]], dtype=float)
    if counts.sum() == 0:
        raise LensInputError("no token survives both removals; use longer texts or fewer filler classes")
    mean = {k: float(np.concatenate(v).mean()) for k, v in per.items()}
    summary = {"loss_original": mean["original"], "loss_filler": mean["filler"], "loss_random": mean["random"],
               "delta_loss_filler": mean["filler"] - mean["original"],
               "delta_loss_random": mean["random"] - mean["original"],
               "n_scored": int(counts.sum() / config.n_random), "n_chunks": n,
               "removed_share": float(np.mean(np.concatenate([~k for k in filler_keep]))),
               **{f"loss_all_{k}": float(np.concatenate(v).mean()) for k, v in all_means.items()}}
    summary["filler_minus_random"] = summary["delta_loss_filler"] - summary["delta_loss_random"]
    for name in ("filler", "random"):
        d = np.array([(a - b).sum() for a, b in zip(per[name], per["original"])])  # per-chunk loss change, summed
        lo, hi = bootstrap_group_means(d, counts, config.n_boot, config.seed + 1)
        summary[f"delta_loss_{name}_ci_low"], summary[f"delta_loss_{name}_ci_high"] = float(lo), float(hi)
    fig = go.Figure(go.Bar(x=["filler removed", "random removed (control)"],
                           y=[summary["delta_loss_filler"], summary["delta_loss_random"]],
                           error_y=dict(type="data", symmetric=False,
                                        array=[summary[f"delta_loss_{k}_ci_high"] - summary[f"delta_loss_{k}"]
                                               for k in ("filler", "random")],
                                        arrayminus=[summary[f"delta_loss_{k}"] - summary[f"delta_loss_{k}_ci_low"]
                                                    for k in ("filler", "random")])))
    fig.update_layout(title=f"Loss change on tokens kept by both removals — {model.model_id} "
                            f"(original {mean['original']:.3f} nats; {summary['removed_share']:.0%} removed)",
                      yaxis_title="Δ loss vs original (nats/token)", template="plotly_white")
    arrays = {"chunk_delta_filler": np.array([(a - b).mean() if len(a) else np.nan
                                              for a, b in zip(per["filler"], per["original"])]),
              "chunk_delta_random": np.array([(a - b).mean() if len(a) else np.nan
                                              for a, b in zip(per["random"], per["original"])])}
    write_result(out_dir, study=STUDY, model=model.model_id, corpus=config.corpus,
                 n_tokens=int(sum(len(c) for c in chunks)), config=config, layers=[], metrics={},
                 summary=summary, arrays=arrays, figures={"main": fig}, wall_time_s=time.time() - t0)
    log.info("filler-tokens: Δ filler %.3f, Δ random %.3f nats", summary["delta_loss_filler"],
             summary["delta_loss_random"])
    return Path(out_dir)
