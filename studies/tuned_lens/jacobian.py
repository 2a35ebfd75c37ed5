"""The tuned-lens study's third lens: the Jacobian lens (Gurnee et al. 2026, :mod:`lens.readout.jacobian_lens`),
fitted on training windows and scored on the same held-out tokens as the logit and tuned lenses.

A fit costs one forward and ``d_model`` single-sequence backwards per prompt (SmolLM2: 576), so on a CPU the study
fits a handful of short windows (``jacobian_prompts`` × ``jacobian_seq_len`` tokens) — or reads a lens fitted
elsewhere (``jacobian_lens=PATH``, from ``lens jlens fit``, on a GPU or in parts). Convergence is measured the way
the issue asks: the prompts are split into two halves fitted apart (their sums add up to the whole fit exactly),
and per layer the two half-lenses' relative difference ‖J_A − J_B‖ / ‖J‖ and their top-1 agreement on held-out
tokens are recorded."""

from __future__ import annotations

import numpy as np
import torch

from lens.errors import LensInputError
from studies.tuned_lens.declaration import A, M, S
from lens.readout.jacobian_fit import fit_sums, settings_for
from lens.readout.jacobian_lens import jacobian_lens_metrics, load_lens, merge_sums

# why the study fits no Jacobian lens by default (jacobian_prompts=0), recorded in the result (issue #38): a CPU
# budget buys 2 short windows, whose two half-fits disagree, so the lens would be a number without a meaning
NOT_FITTED = ("not fitted (the default, jacobian_prompts=0): a fit costs d_model backward passes per prompt — on "
              "SmolLM2 about 110 s of two CPU cores for the 2 windows of 48 tokens the main job used to fit — and "
              "those are far from converged: on the main job's store their two half-fits differ by ‖J_A − J_B‖/‖J‖ "
              "= 1.84 at layer 0, 1.0 at 18, 0.24 at 28 and agree on the top-1 of at most 36% of held-out tokens "
              "below layer 23 (the reference averages hundreds of 128-token prompts). Fit one with "
              "`lens jlens fit` (a GPU, or --part on CPUs) and pass --param jacobian_lens=PATH, or fit here with "
              "--param jacobian_prompts=N (N >= 2; the result then shows the half-fits' agreement)")


def training_prompts(tokens: dict, train_rows: np.ndarray, n: int, seq_len: int, seed: int) -> list[np.ndarray]:
    """``n`` whole training windows (drawn with ``seed``), each its first ``seq_len`` token ids in position order."""
    win = np.asarray(tokens["window"])
    pos = np.asarray(tokens["pos"])
    ids = np.asarray(tokens["token_id"])
    train_windows = np.unique(win[train_rows])
    pick = np.sort(np.random.default_rng(seed).permutation(train_windows)[:n])
    prompts = []
    for w in pick:
        rows = np.nonzero(win == w)[0]
        rows = rows[np.argsort(pos[rows], kind="stable")]
        if not np.array_equal(pos[rows], np.arange(rows.size)):
            raise LensInputError(f"window {int(w)} of the store does not hold every position (a thinned capture, "
                                 "--positions?): the Jacobian lens needs whole windows (--param jacobian_prompts=0)")
        prompts.append(ids[rows][:seq_len].astype(np.int64))
    return prompts


def jacobian_part(config, model, store, train_rows, test_states, test_final, nt, kw: dict) -> tuple[dict, dict, dict]:
    """(metrics, summary, arrays) of the Jacobian lens beside the other two; empty metrics when it is off."""
    L = model.n_layers
    site = getattr(config.site, "value", config.site)
    if site != "resid_post":
        return {}, {S.jacobian_note: f"not fitted: the Jacobian lens reads resid_post, this run decodes {site}"}, {}
    if config.jacobian_lens:
        lens, halves = load_lens(config.jacobian_lens, model), None
        lens.check_model(model, site)
        note = f"read from {config.jacobian_lens} ({lens.n_prompts} prompts)"
    elif config.jacobian_prompts >= 2:
        settings = settings_for(model, skip_first=config.jacobian_skip_first, max_seq_len=config.jacobian_seq_len)
        prompts = training_prompts(store.tokens, train_rows, config.jacobian_prompts, config.jacobian_seq_len,
                                   config.seed)
        halves = [fit_sums(model, prompts[h::2], settings, dim_batch=config.jacobian_dim_batch,
                           corpus=store.manifest.get("corpus", {}).get("name", ""), progress=config.progress)
                  for h in (0, 1)]
        lens = merge_sums(halves).lens()
        note = (f"fitted on {lens.n_prompts} training windows of at most {settings.max_seq_len} tokens, the first "
                f"{settings.skip_first} positions skipped")
    elif config.jacobian_prompts == 0:
        return {}, {S.jacobian_note: NOT_FITTED}, {}
    else:
        return {}, {S.jacobian_note: "not fitted (jacobian_prompts < 2 and no jacobian_lens file)"}, {}
    jr = jacobian_lens_metrics(model, lens, test_states, test_final, nt, site, **kw)
    metrics = {M.jacobian_lens_ce: jr.ce, M.jacobian_lens_kl: jr.kl_to_final,
               M.jacobian_lens_top1_agreement: jr.top1_agreement}
    summary = {S.jacobian_note: note, S.jacobian_n_prompts: lens.n_prompts}
    arrays = {A.jacobian_lens_token_ce: jr.token_ce}
    if halves is not None and all(h.n_prompts for h in halves):
        la, lb = (h.lens() for h in halves)
        rel = np.zeros(L)
        for i, l in enumerate(lens.layers):
            rel[l] = float(torch.linalg.norm(la.matrices[i] - lb.matrices[i]) / torch.linalg.norm(lens.matrices[i]))
        sub = np.arange(min(config.jacobian_half_tokens, len(nt)))  # a prefix of the (already random) held-out sample
        tops = [jacobian_lens_metrics(model, h, {l: test_states[l][sub] for l in test_states}, test_final[sub],
                                      nt[sub], site, **kw).token_top1 for h in (la, lb)]
        metrics[M.jacobian_half_rel_diff] = rel
        metrics[M.jacobian_half_top1_agreement] = (tops[0] == tops[1]).mean(1)
    return metrics, summary, arrays
