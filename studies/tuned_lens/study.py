"""Study: tuned lens (Belrose et al. 2023) beside the logit lens, on held-out documents.

One affine translator per layer is trained with Adam to minimise KL(p_final ‖ p_layer) on the
training documents (:mod:`lens.readout.tuned_lens`), starting from the least-squares affine map to the last
layer's states (``init="lstsq"``, Din et al. 2023; each KL step costs a decoding of
``batch_tokens`` × layers tokens forward and back, so on a CPU the budget buys tens of steps, not the
paper's thousands — measured on SmolLM2 the least-squares start alone takes the mid-layer CE from
~23 to ~7 nats) or from the logit lens (``init="identity"``, Belrose et al.); both lenses are then
evaluated on ``sample_tokens`` held-out tokens. The trained lens is saved in ``tuned_lens/``
(safetensors + JSON) and reloads with ``lens.readout.tuned_lens.TunedLens.load``. Judged: the smallest
per-layer CE gain over the logit lens and the share of the tuned lens's CE drop after mid depth, each with a 95%
interval over held-out documents (windows when fewer than 10) and values for translators refitted on a quarter
and a half of the training units (``nested``): their least-squares starts come from the same pass over the store
as the full fit's, they take steps in proportion to their training tokens (the same passes over their data as the
full fit over its), and all three are scored on the same ``nested_tokens`` held-out tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens.errors import LensInputError
from lens.sites import OUTPUT_SITE
from studies.core import stability
from studies.core.config import SiteConfig, require_budget
from studies.core.contract import Inputs, Needs, Study, StudyResult
from studies.core.sampling import held_out, sample_rows, split_units
from studies.logit_lens.declaration import late_drop_share
from studies.tuned_lens.declaration import A, CLAIMS, HEADLINES, M, RESULT, S, min_gain
from lens.readout.logit_lens import logit_lens
from lens.readout.tuned_lens import TRAIN_PRECISIONS, fit_tuned_lenses, tuned_lens_metrics
from studies.core.stats import profile_interval
from studies.tuned_lens.jacobian import jacobian_part

LENS_FOLDER = "tuned_lens"


@dataclass(frozen=True)
class Config(SiteConfig):
    """``steps`` Adam steps of ``batch_tokens`` training tokens each (every layer per step) at
    learning rate ``lr``; ``test_fraction`` of documents held out; ``min_split_tokens`` tokens each
    split needs at least; ``split_by``: "auto" (default: by document when the store has at least
    ``min_docs`` of them, else by window), "doc" or "window" — windows of one article share its
    topic, so held-out windows are a weaker test than held-out documents; ``init``: "lstsq" or
    "identity" (see above); ``precision`` of the training steps' products: "auto" (bfloat16 mixed
    precision where the device multiplies bfloat16 natively, else float32), "float32" or "bfloat16"
    (:func:`lens.readout.tuned_lens.fit_tuned_lens`; evaluation is float32 either way); ``sample_tokens``:
    held-out tokens both lenses are scored on, a random sample of the held-out documents' tokens
    (0 = all); ``nested``: refit the translators on a quarter and a half of the training units and score them on
    the same held-out tokens (:mod:`studies.core.stability`: is the judged gain a property of the fit's sample size?),
    each for ``steps`` × its share of the training tokens (rounded up), all three scored on the first ``nested_tokens``
    of the held-out sample (a random draw already; 0 = all of it), the full fit's value there read from its scores.

The Jacobian lens (:mod:`studies.tuned_lens.jacobian`): fitted on ``jacobian_prompts`` training windows of at most
``jacobian_seq_len`` tokens, the first ``jacobian_skip_first`` positions skipped (the reference's 16), ``jacobian_dim_batch``
output dimensions per backward pass, two halves fitted apart and compared on ``jacobian_half_tokens`` held-out tokens;
or read from ``jacobian_lens`` (a file of ``lens jlens fit``). Off by default (``jacobian_prompts=0``, the result's
``jacobian_note`` says why: :data:`studies.tuned_lens.jacobian.NOT_FITTED`)."""

    steps: int = 30
    init: str = "lstsq"
    precision: str = "auto"
    batch_tokens: int = 128
    lr: float = 1e-3
    test_fraction: float = 0.2
    min_split_tokens: int = 32
    sample_tokens: int = 2048
    chunk_size: int = 512
    drop_special: bool = True
    split_by: str = "auto"
    min_docs: int = 2
    nested: bool = True
    nested_tokens: int = 512
    jacobian_prompts: int = 0
    jacobian_seq_len: int = 48
    jacobian_skip_first: int = 16
    jacobian_dim_batch: int = 16
    jacobian_half_tokens: int = 256
    jacobian_lens: str = ""


def check(config: Config) -> None:
    require_budget("tuned-lens", "sample_tokens", config.sample_tokens)
    if config.precision not in TRAIN_PRECISIONS:
        raise LensInputError(f"precision must be one of {TRAIN_PRECISIONS}; got {config.precision!r}")


def needs(config: Config) -> Needs:
    return Needs(sites=tuple(dict.fromkeys((config.site, OUTPUT_SITE))), model=True, lm_head=True)


def split_rows(tokens, mask, fraction: float, seed: int, min_tokens: int, split_by: str = "auto",
               min_docs: int = 2):
    """(train rows, held-out rows, unit): whole documents (or capture windows) held out; "auto" splits
    by document when the store has at least ``min_docs`` of them, else by window."""
    units, split_by = split_units(tokens, split_by, min_docs)
    n_units = np.unique(units[mask]).size
    if n_units < 2:
        raise LensInputError(f"the train / held-out split is by {split_by} and needs at least 2 of them; "
                             f"the store has {n_units} (raise --max-tokens, or --param split_by=window)")
    test = held_out(units, fraction, seed)
    train_rows, test_rows = np.nonzero(mask & ~test)[0], np.nonzero(mask & test)[0]
    if min(train_rows.size, test_rows.size) < min_tokens:
        # by document, a store of few documents holds out a whole one; by window it splits more finely
        finer = ", or --param split_by=window" if split_by == "doc" else ""
        raise LensInputError(
            f"too few tokens for the split by {split_by}: {train_rows.size} training and {test_rows.size} "
            f"held-out tokens, expected at least {min_tokens} each (raise --max-tokens{finer})")
    return train_rows, test_rows, split_by


def sample_units_of(tokens: dict, rows: np.ndarray, min_docs: int = 10) -> tuple[np.ndarray, str]:
    """Per row of ``rows``: its document when ``rows`` hold at least ``min_docs`` of them, else its window
    (:func:`studies.core.sampling.split_units` on those rows' token table), and which."""
    sub = {c: np.asarray(tokens[c])[rows] for c in ("doc", "window")}
    return split_units(sub, "auto", min_docs)


def judged_numbers(tuned_token_ce: np.ndarray, logit_token_ce: np.ndarray, units: np.ndarray, seed: int = 0) -> dict:
    """The judged summary values of the held-out scores (layer, token; NaN = no next token): the smallest CE gain
    over the logit lens at any layer but the last, and the share of the tuned lens's CE drop after mid depth, each
    with a 95% interval that resamples the held-out ``units`` (documents or windows) whole."""
    with np.errstate(invalid="ignore"):
        tuned, logit = np.nanmean(tuned_token_ce, 1), np.nanmean(logit_token_ce, 1)
    gains = (logit - tuned)[:-1]
    g_low, g_high = profile_interval(min_gain, [tuned_token_ce, logit_token_ce], units, seed=seed)
    s_low, s_high = profile_interval(late_drop_share, [tuned_token_ce], units, seed=seed)
    return {S.min_ce_gain: min_gain(tuned, logit), S.min_ce_gain_low: g_low, S.min_ce_gain_high: g_high,
            S.min_ce_gain_layer: int(np.argmin(gains)) if gains.size else None,
            S.late_drop_share: late_drop_share(tuned), S.late_drop_share_low: s_low, S.late_drop_share_high: s_high}


def nested_records(ces, logit_ce: np.ndarray, sizes) -> dict:
    """``nested__`` records (:mod:`studies.core.stability`) of the judged numbers for translators fitted on nested
    subsamples of the training units (``sizes`` training tokens each): ``ces`` their per-layer held-out CE, on the
    same tokens as ``logit_ce`` (the logit lens, fit-free)."""
    gains, shares = [], []
    for ce in ces:
        ce = np.asarray(ce, dtype=np.float64)
        gains.append(min_gain(ce, logit_ce))
        shares.append(late_drop_share(ce))
    return {**stability.record("min_ce_gain", gains, sizes), **stability.record("late_drop_share", shares, sizes)}


def nested_steps(steps: int, n_rows: int, n_all: int) -> int:
    """Steps of a refit on ``n_rows`` of the ``n_all`` training tokens: ``steps`` in proportion, rounded up (the
    same passes over its data as the full fit's over all)."""
    return 0 if steps <= 0 else max(1, math.ceil(steps * n_rows / n_all))


def layer_means(token_ce: np.ndarray, cols) -> np.ndarray:
    """Per-layer mean of the scored tokens ``cols`` of a (layer, token) CE (NaN = no next token)."""
    with np.errstate(invalid="ignore"):
        return np.nanmean(np.asarray(token_ce, dtype=np.float64)[:, cols], axis=1)


def compute(config: Config, inputs: Inputs) -> StudyResult:
    model, store = inputs.model, inputs.store
    L = inputs.card.n_layers
    mask = store.mask(config.drop_special)
    train_rows, test_rows, split_unit = split_rows(store.tokens, mask, config.test_fraction, config.seed,
                                                   config.min_split_tokens, config.split_by, config.min_docs)
    test_rows = sample_rows(test_rows, config.sample_tokens, config.seed)
    # every layer read by rows where it is used (lazy: a chunk of one layer at a time), never whole: the
    # least-squares start reads at most 50k training rows in chunks, each step its batch, the scoring its
    # held-out sample
    view = store.view(config.site, layers=range(L)).astype(torch.float32)
    # the lens is trained toward the model's output: the last layer of OUTPUT_SITE (of the site decoded, when it is)
    final_view = view if config.site == OUTPUT_SITE else store.view(OUTPUT_SITE, layers=[L - 1]).astype(torch.float32)
    states = view.lazy()
    final = states[L - 1] if final_view is view else final_view.lazy()[L - 1]

    # the nested refits take a quarter and a half of the training documents (windows), and their least-squares
    # starts come from the full fit's pass over the store (lens.readout.tuned_lens.least_squares_inits)
    train_units, nested_unit = sample_units_of(store.tokens, train_rows)
    masks = stability.nested_units(train_units, config.seed) if config.nested else [np.ones(train_rows.size, bool)]
    sizes = [int(m.sum()) for m in masks]
    fits = fit_tuned_lenses(model, states, final, [train_rows[m] for m in masks],
                            steps=[nested_steps(config.steps, k, train_rows.size) for k in sizes],
                            batch_tokens=config.batch_tokens, lr=config.lr, seed=config.seed, init=config.init,
                            precision=config.precision, progress=config.progress)
    tl = fits[-1]  # the last nested subsample is every training unit: the fit of every training token
    test_states = view.take(test_rows).lazy()
    nt = np.asarray(store.tokens["next_token_id"])[test_rows]
    kw = dict(chunk_size=config.chunk_size, progress=config.progress)
    test_final = test_states[L - 1] if final_view is view else final_view.take(test_rows).lazy()[L - 1]
    tuned = tuned_lens_metrics(model, tl, test_states, test_final, nt, **kw)
    logit = logit_lens(model, test_states, test_final, nt, **kw)
    # intervals resample the held-out documents when there are at least 10 of them, else their windows
    test_units, interval_unit = sample_units_of(store.tokens, test_rows)
    judged = judged_numbers(tuned.token_ce, logit.token_ce, test_units, config.seed)
    nested = {}
    if config.nested:
        # the three fits on the same held-out tokens: the first nested_tokens of the (random) sample; the full
        # fit's and the logit lens' values there are read from their scores, the refits are scored there
        sub = np.arange(len(nt) if config.nested_tokens <= 0 else min(config.nested_tokens, len(nt)))
        sub_states = {l: test_states[l][sub] for l in test_states}
        ces = [tuned_lens_metrics(model, f, sub_states, test_final[sub], nt[sub], **kw).ce for f in fits[:-1]]
        nested = nested_records([*ces, layer_means(tuned.token_ce, sub)], layer_means(logit.token_ce, sub), sizes)
        nested_unit = f"{nested_unit}, scored on {sub.size} held-out tokens"

    j_metrics, j_summary, j_arrays = jacobian_part(config, model, store, train_rows, test_states, test_final, nt, kw)
    if M.jacobian_lens_ce in j_metrics and L > 1:
        j_summary[S.mean_ce_gain_jacobian] = float(np.mean(logit.ce[:-1] - j_metrics[M.jacobian_lens_ce][:-1]))
    d_vocab = getattr(model, "d_vocab", None)
    uniform_ce = float(np.log(d_vocab)) if d_vocab else None
    hist = tl.loss_history_
    train_kl = np.zeros(L)
    if hist.size:
        tail = hist[-max(1, len(hist) // 10):].mean(0)
        for i, l in enumerate(tl.layer_ids):
            train_kl[l] = tail[i]
    metrics = {M.ce: tuned.ce, M.kl_to_final: tuned.kl_to_final, M.top1_agreement: tuned.top1_agreement,
               M.entropy: tuned.entropy, M.median_rank: tuned.median_rank, M.logit_lens_ce: logit.ce,
               M.logit_lens_kl: logit.kl_to_final, M.logit_lens_top1_agreement: logit.top1_agreement,
               M.train_kl: train_kl, **j_metrics}
    summary = {S.n_train_tokens: int(train_rows.size), S.n_test_tokens: int(test_rows.size),
               S.split_unit: split_unit,
               S.mean_ce_gain: float(np.mean(logit.ce[:-1] - tuned.ce[:-1])) if L > 1 else 0.0,
               S.mean_kl_tuned: float(np.mean(tuned.kl_to_final)), S.mean_kl_logit: float(np.mean(logit.kl_to_final)),
               S.final_ce: float(tuned.ce[-1]), S.lens_path: LENS_FOLDER, **judged, **nested,
               S.interval_unit: f"held out: {interval_unit}; nested refits: training {nested_unit}",
               S.uniform_ce: uniform_ce,
               S.n_layers_worse_than_uniform: None if uniform_ce is None else int(np.sum(tuned.ce > uniform_ce)),
               S.logit_lens_layers_worse_than_uniform: None if uniform_ce is None else int(np.sum(logit.ce > uniform_ce)),
               **j_summary}
    arrays = {A.layers: tuned.layers, A.loss_history: hist, A.token_ce: tuned.token_ce,
              A.logit_lens_token_ce: logit.token_ce, A.test_rows: test_rows, A.train_rows: train_rows,
              A.translator_layers: np.asarray(tl.layer_ids), **j_arrays}
    return StudyResult(model=store.model_id, corpus=inputs.corpus, n_tokens=store.n_tokens,
                       layers=tuned.layers.tolist(), metrics=metrics, summary=summary, arrays=arrays,
                       extra={"site": config.site.value, "lens_folder": LENS_FOLDER, "units": "nats",
                              "split": f"by {split_unit} (studies.core.sampling.held_out)"},
                       files={LENS_FOLDER: tl})


def figures(result: StudyResult, config: Config) -> dict:
    m = result.metrics
    fig = make_subplots(rows=1, cols=2, subplot_titles=("cross-entropy, true next token (held out)",
                                                        "KL(final ‖ layer) (held out)"))
    x = list(result.layers)
    fig.add_trace(go.Scatter(x=x, y=m[M.logit_lens_ce], mode="lines+markers", name="logit lens CE"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=m[M.ce], mode="lines+markers", name="tuned lens CE"), 1, 1)
    if m.get(M.jacobian_lens_ce) is not None:
        fig.add_trace(go.Scatter(x=x, y=m[M.jacobian_lens_ce], mode="lines+markers", name="Jacobian lens CE"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=m[M.logit_lens_kl], mode="lines+markers", name="logit lens KL"), 1, 2)
    if m.get(M.jacobian_lens_kl) is not None:
        fig.add_trace(go.Scatter(x=x, y=m[M.jacobian_lens_kl], mode="lines+markers", name="Jacobian lens KL"), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=m[M.kl_to_final], mode="lines+markers", name="tuned lens KL"), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=m[M.train_kl], mode="lines", name="tuned lens KL (training)",
                             line=dict(dash="dot")), 1, 2)
    if result.summary.get(S.uniform_ce):
        fig.add_hline(y=result.summary[S.uniform_ce], line_dash="dot", line_color="grey", row=1, col=1,
                      annotation_text="uniform (ln V)")
    fig.update_xaxes(title_text=RESULT.axis(result).title)
    fig.update_yaxes(title_text="nats")
    fig.update_layout(title=f"Tuned, Jacobian and logit lenses — {result.model}", template="plotly_white",
                      hovermode="x unified")
    return {"main": fig}


STUDY = Study(
    # the full fit's 30 KL steps and the two lenses' scoring of 2048 held-out tokens are most of it; the nested
    # refits add 0.75 of a fit and two scorings of nested_tokens; the Jacobian lens (off by default) would add
    # d_model backward passes per prompt and two more scorings. Measured back to back on the main job's store (2
    # threads, a shared Intel Xeon under load ~4, steps=8 sample_tokens=512): 930 s before issue #38's cuts, 173 s after
    cost=250,
    config=Config, check=check, needs=needs, compute=compute, figures=figures,
    result=RESULT,
    headlines=HEADLINES, claims=CLAIMS)
