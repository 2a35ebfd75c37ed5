"""Study: tuned lens (Belrose et al. 2023) beside the logit lens, on held-out documents.

One affine translator per layer is trained with Adam to minimise KL(p_final ‖ p_layer) on the
training documents (:mod:`lens.tuned_lens`), starting from the least-squares affine map to the last
layer's states (``init="lstsq"``, Din et al. 2023; each KL step costs a decoding of
``batch_tokens`` × layers tokens forward and back, so on a CPU the budget buys tens of steps, not the
paper's thousands — measured on SmolLM2 the least-squares start alone takes the mid-layer CE from
~23 to ~7 nats) or from the logit lens (``init="identity"``, Belrose et al.); both lenses are then
evaluated on the held-out documents. Result metrics (one entry per layer of ``resid_post``): ``ce``,
``kl_to_final``, ``top1_agreement``, ``entropy`` of the tuned lens; ``logit_lens_ce``,
``logit_lens_kl``, ``logit_lens_top1_agreement`` of the logit lens on the same tokens;
``train_kl`` (tuned lens, mean over the last tenth of training steps). Summary: token counts per
split, mean CE gain (logit − tuned). The trained lens is saved in ``tuned_lens/`` (safetensors +
JSON) and reloads with ``lens.tuned_lens.TunedLens.load``. Arrays: ``loss_history`` [step, layer],
``token_ce`` / ``logit_lens_token_ce`` [layer, test token], ``test_rows`` [test token].
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lens.errors import LensInputError
from lens.logit_lens import logit_lens
from lens.tuned_lens import fit_tuned_lens, tuned_lens_metrics
from studies.common import StudyConfig, prepare, probe_split_docs
from studies.prediction_gains import split_units
from studies.lens_support import finite_or_none, lens_model, site_states, text_mask
from studies.results import write_result

log = logging.getLogger(__name__)

STUDY = "tuned-lens"


@dataclass(frozen=True)
class Config(StudyConfig):
    """``steps`` Adam steps of ``batch_tokens`` training tokens each (every layer per step) at
    learning rate ``lr``; ``test_fraction`` of documents held out; ``min_split_tokens`` tokens each
    split needs at least; ``split_by``: "auto" (default: by document when the store has at least
    ``min_docs`` of them, else by window), "doc" or "window" — windows of one article share its
    topic, so held-out windows are a weaker test than held-out documents; ``init``: "lstsq" or "identity" (see above);
    ``eval_tokens``: held-out tokens both lenses are scored on, a random sample of the held-out
    documents' tokens (0 = all)."""

    steps: int = 30
    init: str = "lstsq"
    batch_tokens: int = 128
    lr: float = 1e-3
    test_fraction: float = 0.2
    min_split_tokens: int = 32
    eval_tokens: int = 2048
    chunk_size: int = 512
    drop_special: bool = True
    split_by: str = "auto"
    min_docs: int = 2


def split_rows(store, mask, fraction: float, seed: int, min_tokens: int, split_by: str = "auto",
               min_docs: int = 2):
    """(train rows, held-out rows, unit): whole documents (or capture windows) held out; "auto" splits
    by document when the store has at least ``min_docs`` of them, else by window."""
    try:
        docs, split_by = split_units(store.tokens, split_by, min_docs)
    except LensInputError as exc:
        raise LensInputError(f"{STUDY}: {exc}") from None
    n_docs = np.unique(docs[mask]).size
    if n_docs < 2:
        raise LensInputError(f"{STUDY}: the train / held-out split is by {split_by} and needs at least 2 of them; "
                             f"the store has {n_docs} (raise --max-tokens, or --param split_by=window)")
    test = probe_split_docs(docs, fraction, seed)
    train_rows, test_rows = np.nonzero(mask & ~test)[0], np.nonzero(mask & test)[0]
    if min(train_rows.size, test_rows.size) < min_tokens:
        raise LensInputError(
            f"{STUDY}: too few tokens for the split: {train_rows.size} training and {test_rows.size} held-out tokens, "
            f"expected at least {min_tokens} each (raise --max-tokens)")
    return train_rows, test_rows, split_by


def figure(layers, tuned, logit, train_kl, model: str):
    fig = make_subplots(rows=1, cols=2, subplot_titles=("cross-entropy, true next token (held out)",
                                                        "KL(final ‖ layer) (held out)"))
    x = list(layers)
    fig.add_trace(go.Scatter(x=x, y=logit.ce, mode="lines+markers", name="logit lens CE"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=tuned.ce, mode="lines+markers", name="tuned lens CE"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=logit.kl_to_final, mode="lines+markers", name="logit lens KL"), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=tuned.kl_to_final, mode="lines+markers", name="tuned lens KL"), 1, 2)
    fig.add_trace(go.Scatter(x=x, y=train_kl, mode="lines", name="tuned lens KL (training)",
                             line=dict(dash="dot")), 1, 2)
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="nats")
    fig.update_layout(title=f"Tuned lens vs logit lens — {model}", template="plotly_white", hovermode="x unified")
    return fig


def run(config: Config, out_dir) -> Path:
    t0 = time.time()
    model = lens_model(config, STUDY)
    _, store = prepare(config, sites=["resid_post"])
    L = model.n_layers
    mask = text_mask(store, config.drop_special)
    train_rows, test_rows, split_unit = split_rows(store, mask, config.test_fraction, config.seed,
                                                   config.min_split_tokens, config.split_by, config.min_docs)
    if config.eval_tokens < 0:
        raise LensInputError(f"{STUDY}: eval_tokens must be >= 0 (0 = all held-out tokens); got {config.eval_tokens}")
    if config.eval_tokens and test_rows.size > config.eval_tokens:
        rng = np.random.default_rng(config.seed)
        test_rows = np.sort(rng.choice(test_rows, size=config.eval_tokens, replace=False))
    states = site_states(store, "resid_post", L)
    final = states[L - 1]
    tl = fit_tuned_lens(model, states, final, train_rows=train_rows, steps=config.steps,
                        batch_tokens=config.batch_tokens, lr=config.lr, seed=config.seed, init=config.init,
                        progress=config.progress)
    test_states = {l: x[test_rows] for l, x in states.items()}
    del states
    nt = np.asarray(store.tokens["next_token_id"])[test_rows]
    kw = dict(chunk_size=config.chunk_size, progress=config.progress)
    tuned = tuned_lens_metrics(model, tl, test_states, test_states[L - 1], nt, **kw)
    logit = logit_lens(model, test_states, test_states[L - 1], nt, **kw)
    hist = tl.loss_history_
    train_kl = np.zeros(L)
    if hist.size:
        tail = hist[-max(1, len(hist) // 10):].mean(0)
        for i, l in enumerate(tl.layer_ids):
            train_kl[l] = tail[i]
    layers = tuned.layers.tolist()
    lens_dir = tl.save(Path(out_dir) / "tuned_lens")
    metrics = {k: finite_or_none(v) for k, v in {
        "ce": tuned.ce, "kl_to_final": tuned.kl_to_final, "top1_agreement": tuned.top1_agreement,
        "entropy": tuned.entropy, "median_rank": tuned.median_rank, "logit_lens_ce": logit.ce,
        "logit_lens_kl": logit.kl_to_final, "logit_lens_top1_agreement": logit.top1_agreement,
        "train_kl": train_kl}.items()}
    summary = {"n_train_tokens": int(train_rows.size), "n_test_tokens": int(test_rows.size), "split_unit": split_unit,
               "mean_ce_gain": float(np.mean(logit.ce[:-1] - tuned.ce[:-1])) if L > 1 else 0.0,
               "mean_kl_tuned": float(np.mean(tuned.kl_to_final)), "mean_kl_logit": float(np.mean(logit.kl_to_final)),
               "final_ce": float(tuned.ce[-1]), "lens_path": "tuned_lens"}
    arrays = {"layers": tuned.layers, "loss_history": hist, "token_ce": tuned.token_ce,
              "logit_lens_token_ce": logit.token_ce, "test_rows": test_rows, "train_rows": train_rows,
              "translator_layers": np.asarray(tl.layer_ids)}
    return write_result(out_dir, study=STUDY, model=config.model, corpus=config.corpus, n_tokens=store.n_tokens,
                        config=config, layers=layers, metrics=metrics, summary=summary, arrays=arrays,
                        figures={"main": figure(layers, tuned, logit, train_kl, config.model)},
                        wall_time_s=time.time() - t0,
                        extra={"site": "resid_post", "lens_folder": str(lens_dir.name), "units": "nats",
                               "split": f"by {split_unit} (studies.common.probe_split_docs)"})
