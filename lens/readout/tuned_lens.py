"""Tuned lens: one learned affine translator per layer before the model's own decoding.

Belrose et al. 2023 ("Eliciting Latent Predictions from Transformers with the Tuned Lens"): the
logit lens is biased because intermediate states live in a different basis than the last one; a
per-layer affine map ``T_l(h) = h + A_l h + b_l`` (``A_l = 0, b_l = 0`` at initialisation, so training
starts from the logit lens) is trained to minimise KL(p_final ‖ softmax(W_U · norm_f(T_l(h_l)))).
The final norm and unembedding stay frozen. The last layer needs no translator (its lens already
is the output) and keeps the identity.

As in the paper's reference code (``tuned_lens.nn.Lens`` vs ``PredictionTrajectory``), the lens is
a plain module (:class:`TunedLens`) and the evaluation reuses :func:`lens.readout.logit_lens.lens_metrics`.
Saved as ``tuned_lens.safetensors`` (the translators) + ``tuned_lens.json`` (layers, d_model,
model id, training record); no pickle.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from lens.errors import LensInputError
from lens.readout.row_stats import kl_to_reference
from lens.readout.logit_lens import LensResult, Readout, as_tensor, lens_metrics, log_softmax, model_readout, require_head
from lens.runtime.precision import PRECISIONS, native_bfloat16

log = logging.getLogger(__name__)

WEIGHTS = "tuned_lens.safetensors"
META = "tuned_lens.json"
TRAIN_PRECISIONS = PRECISIONS  # one vocabulary for every precision setting (lens.runtime.precision)


class TunedLens(nn.Module):
    """Affine translators ``h -> h + A_l h + b_l`` for ``layers`` (identity at initialisation)."""

    def __init__(self, d_model: int, layers: Sequence[int], model_id: str = ""):
        super().__init__()
        if d_model < 1 or not len(layers):
            raise LensInputError(f"a tuned lens needs d_model >= 1 and at least one layer; got {d_model}, {list(layers)}")
        self.d_model = int(d_model)
        self.layer_ids = [int(l) for l in layers]
        self.model_id = model_id
        self.translators = nn.ModuleList(nn.Linear(d_model, d_model) for _ in self.layer_ids)
        for t in self.translators:
            nn.init.zeros_(t.weight)
            nn.init.zeros_(t.bias)
        self.training_record: dict = {}

    def _index(self, layer: int) -> int:
        try:
            return self.layer_ids.index(int(layer))
        except ValueError:
            raise LensInputError(f"the tuned lens has no translator for layer {layer} (has {self.layer_ids})") from None

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """T_l(h); a layer without a translator (the last one) passes through unchanged."""
        if int(layer) not in self.layer_ids:
            return h
        t = self.translators[self._index(layer)]
        return h + t(h.to(t.weight.dtype)).to(h.dtype)

    def readout(self, model) -> Readout:
        """The model's final norm and unembedding after this lens' translators, for
        :func:`lens.readout.logit_lens.lens_metrics`."""
        return model_readout(model, self.translate)

    # ------------------------------------------------------------------ persistence
    def save(self, folder) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {f"{l}.{name}": p.detach().cpu().contiguous()
                   for l, t in zip(self.layer_ids, self.translators) for name, p in t.named_parameters()}
        save_file(tensors, str(folder / WEIGHTS))
        meta = {"format": "lens-workbench tuned lens", "version": 1, "d_model": self.d_model,
                "layers": self.layer_ids, "model_id": self.model_id, "training": self.training_record}
        (folder / META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        return folder

    @classmethod
    def load(cls, folder) -> "TunedLens":
        folder = Path(folder)
        if not (folder / META).is_file() or not (folder / WEIGHTS).is_file():
            raise LensInputError(f"{folder} is not a saved tuned lens: expected {META} and {WEIGHTS}")
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        lens = cls(meta["d_model"], meta["layers"], meta.get("model_id", ""))
        tensors = load_file(str(folder / WEIGHTS))
        with torch.no_grad():
            for l, t in zip(lens.layer_ids, lens.translators):
                for name, p in t.named_parameters():
                    key = f"{l}.{name}"
                    if key not in tensors or tensors[key].shape != p.shape:
                        raise LensInputError(f"{folder / WEIGHTS}: tensor {key} missing or of the wrong shape")
                    p.copy_(tensors[key])
        lens.training_record = meta.get("training", {})
        return lens


@contextmanager
def frozen_parameters(module: nn.Module):
    """Gradients flow through the model's norm + unembedding, but never into its parameters."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _lstsq_rows(rows, max_rows: int, seed: int) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size > max_rows:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_rows, replace=False))
    return rows


@torch.no_grad()
def least_squares_init(lens: TunedLens, states: Mapping[int, object], final, rows: np.ndarray,
                       ridge: float = 1e-4, max_rows: int = 50_000, seed: int = 0,
                       chunk_rows: int = 8192) -> None:
    """Set each translator to the least-squares affine map from layer l's states to the last layer's
    (Din et al. 2023, "Jump to Conclusions": a linear map fitted this way already decodes better than
    the logit lens). Fitted in float64 on (at most ``max_rows`` of) ``rows``, with a ridge of
    ``ridge`` × the mean variance for conditioning: ``h + A h + b ≈ h_final``.

    :func:`least_squares_inits` with one lens and one row set (see there for how the store is read)."""
    least_squares_inits([lens], states, final, [rows], ridge=ridge, max_rows=max_rows, seed=seed,
                        chunk_rows=chunk_rows)


@torch.no_grad()
def least_squares_inits(lenses: Sequence[TunedLens], states: Mapping[int, object], final, row_sets: Sequence,
                        ridge: float = 1e-4, max_rows: int = 50_000, seed: int = 0, chunk_rows: int = 8192,
                        cache_final: int = 1 << 26) -> None:
    """:func:`least_squares_init` of ``lenses[k]`` on ``row_sets[k]`` (each at most ``max_rows``, drawn with
    ``seed``), every set fitted from one pass over the union of the rows: the rows are split into the groups of
    rows that belong to the same sets (nested sets — a quarter, a half holding it, all — give three), each group's
    moments are summed once per layer and each set's are the sum of its groups'.

    Per layer and group, in float64: the row count, Σ x, Σ y and the Gram sums Σ x xᵀ, Σ x yᵀ of the states
    shifted by one reference row (``x`` layer l, ``y`` the last layer; the shift keeps the centring exact where
    the states' means are large against their spread); a set's centred ``C = Xcᵀ Xc`` and ``Xcᵀ Yc`` follow, and
    ``A = (C + λI)⁻¹ (Xcᵀ Yc − C)`` fits the update ``y − x ≈ Xc A + b`` the translator adds (λ = ``ridge`` ×
    mean diag C). ``states[l]`` and ``final`` are read by rows, ``chunk_rows`` at a time (a store's lazy layers,
    :meth:`lens.store.views.LayerView.lazy`, are never held whole): memory is four d × d float64 matrices per
    group and one chunk of each layer, plus the last layer's rows in float32 when they are at most
    ``cache_final`` numbers (read once, not once per layer)."""
    if len(lenses) != len(row_sets) or not lenses:
        raise LensInputError(f"least_squares_inits needs one row set per lens; got {len(lenses)} lenses and "
                             f"{len(row_sets)} row sets")
    layer_ids = lenses[0].layer_ids
    if any(l.layer_ids != layer_ids for l in lenses):
        raise LensInputError("least_squares_inits fits lenses of the same layers")
    sets = [_lstsq_rows(r, max_rows, seed) for r in row_sets]
    union = np.unique(np.concatenate(sets))
    member = np.stack([np.isin(union, s) for s in sets], 1)  # (row, set)
    signatures, group_of = np.unique(member, axis=0, return_inverse=True)
    group_of = np.asarray(group_of).reshape(-1)
    groups = [union[group_of == g] for g in range(len(signatures))]
    chunks = [[rows[lo:lo + chunk_rows] for lo in range(0, rows.size, chunk_rows)] for rows in groups]

    def read(x, r) -> torch.Tensor:
        return as_tensor(x[r], "cpu", torch.float32)

    cached = None
    if union.size * lenses[0].d_model <= cache_final:
        cached = [[read(final, r) for r in cs] for cs in chunks]
    shift_y = read(final, union[:1]).double()[0]

    def final_chunk(g, i, r) -> torch.Tensor:
        return (cached[g][i] if cached is not None else read(final, r)).double() - shift_y

    y_sum = [sum(final_chunk(g, i, r).sum(0) for i, r in enumerate(cs)) for g, cs in enumerate(chunks)]
    for j, l in enumerate(layer_ids):
        shift_x = read(states[l], union[:1]).double()[0]
        d = shift_x.numel()
        parts = []  # per group: (n, Σx, Σy, Σ x xᵀ, Σ x yᵀ), shifted
        for g, cs in enumerate(chunks):
            sx = torch.zeros(d, dtype=torch.float64)
            xx = torch.zeros(d, d, dtype=torch.float64)
            xy = torch.zeros(d, d, dtype=torch.float64)
            for i, r in enumerate(cs):
                X = read(states[l], r).double() - shift_x
                sx += X.sum(0)
                xx.addmm_(X.T, X)
                xy.addmm_(X.T, final_chunk(g, i, r))
            parts.append((groups[g].size, sx, y_sum[g], xx, xy))
        for k, lens in enumerate(lenses):
            mine = [parts[g] for g in range(len(parts)) if signatures[g, k]]
            n = sum(p[0] for p in mine)
            sx, sy, xx, xy = (sum(p[i] for p in mine) for i in range(1, 5))
            mx, my = sx / n, sy / n
            C = xx - n * torch.outer(mx, mx)
            B = (xy - n * torch.outer(mx, my)) - C  # the translator adds A h + b to h: fit the update
            lam = ridge * float(torch.diagonal(C).mean())
            C.diagonal().add_(lam)
            A = torch.linalg.solve(C, B)  # (d, d): update ≈ Xc A
            mx, my = mx + shift_x, my + shift_y
            t = lens.translators[j]
            t.weight.copy_(A.T.to(t.weight.dtype))
            t.bias.copy_(((my - mx) - mx @ A).to(t.bias.dtype))


def _check_fit_args(model, states, final, row_sets, steps, batch_tokens, init, precision) -> int:
    if init not in ("identity", "lstsq"):
        raise LensInputError(f"init must be 'identity' or 'lstsq'; got {init!r}")
    if precision not in TRAIN_PRECISIONS:
        raise LensInputError(f"precision must be one of {TRAIN_PRECISIONS}; got {precision!r}")
    require_head(model)
    n = len(final)
    for rows in row_sets:
        if rows.size < 2:
            raise LensInputError(f"the tuned lens needs training tokens; got {rows.size}")
    if min(steps) < 0 or batch_tokens < 1:
        raise LensInputError(f"steps must be >= 0 and batch_tokens >= 1; got {min(steps)}, {batch_tokens}")
    return n


def fit_tuned_lens(model, states: Mapping[int, object], final, *, train_rows=None, steps: int = 300,
                   batch_tokens: int = 256, lr: float = 1e-3, seed: int = 0, init: str = "identity",
                   precision: str = "float32", progress: bool = False) -> TunedLens:
    """Train one translator per layer of ``states`` (the last layer excluded) with Adam on the KL to
    the final layer's distribution, over tokens ``train_rows`` (default all).

    ``init``: "identity" (Belrose et al.: training starts from the logit lens) or "lstsq" (start from
    the least-squares map to the last layer's states, :func:`least_squares_init`). Each step draws
    ``batch_tokens`` training tokens; each layer's loss is back-propagated on its own (the losses are
    independent), so memory stays at one ``batch_tokens × d_vocab`` graph.

    ``precision`` of the training steps' translator and unembedding products: "float32", "bfloat16"
    (mixed precision: float32 weights, optimizer state, reference distribution, softmax and loss;
    bfloat16 matrix products under autocast) or "auto" (bfloat16 where the device multiplies it
    natively, :func:`lens.runtime.precision.native_bfloat16`, else float32). The trained lens is a float32
    module either way and is evaluated in float32.
    """
    return fit_tuned_lenses(model, states, final, [train_rows], steps=[steps], batch_tokens=batch_tokens, lr=lr,
                            seed=seed, init=init, precision=precision, progress=progress)[0]


def fit_tuned_lenses(model, states: Mapping[int, object], final, row_sets: Sequence, *, steps: Sequence[int],
                     batch_tokens: int = 256, lr: float = 1e-3, seed: int = 0, init: str = "identity",
                     precision: str = "float32", progress: bool = False) -> list[TunedLens]:
    """:func:`fit_tuned_lens` on each of ``row_sets`` (None = every token) for ``steps[k]`` steps, the same
    arguments otherwise; the least-squares starts (``init="lstsq"``) of every set come from one pass over the
    union of their rows (:func:`least_squares_inits`), so nested sets (a study's refits on a quarter and a half
    of its training units) cost one reading of the store, not one each. Each fit is the one
    :func:`fit_tuned_lens` would give on its set alone (its own batches, drawn with ``seed``)."""
    n = len(final)
    row_sets = [np.arange(n) if r is None else np.asarray(r, dtype=np.int64) for r in row_sets]
    steps = [int(s) for s in steps]
    if len(steps) != len(row_sets):
        raise LensInputError(f"fit_tuned_lenses needs one step count per row set; got {steps} for {len(row_sets)}")
    _check_fit_args(model, states, final, row_sets, steps, batch_tokens, init, precision)
    last = model.n_layers - 1
    layers = [l for l in sorted(states) if l != last]
    device = model.device
    lenses = [TunedLens(model.d_model, layers or [last], model.model_id) for _ in row_sets]
    if not layers:
        return [lens.to(device) for lens in lenses]
    for l in layers:
        if len(states[l]) != n:
            raise LensInputError(f"layer {l} has {len(states[l])} token states, expected {n}")
    if init == "lstsq":
        least_squares_inits(lenses, states, final, row_sets, seed=seed)
    mixed = precision == "bfloat16" or (precision == "auto" and native_bfloat16(device))
    return [_train(model, lens.to(device), states, final, rows, layers, steps=k, batch_tokens=batch_tokens, lr=lr,
                   seed=seed, init=init, mixed=mixed, progress=progress)
            for lens, rows, k in zip(lenses, row_sets, steps)]


def _train(model, lens: TunedLens, states, final, train_rows: np.ndarray, layers: list[int], *, steps: int,
           batch_tokens: int, lr: float, seed: int, init: str, mixed: bool, progress: bool) -> TunedLens:
    """``steps`` Adam steps of :func:`fit_tuned_lens` from ``lens``'s start (its training record and loss
    history set)."""
    device = model.device
    opt = torch.optim.Adam(lens.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    decode = _bfloat16_decoder(model) if mixed else model.decode
    losses = np.zeros((steps, len(layers)), np.float32)
    bar = tqdm(total=steps, desc="tuned lens", unit="step", disable=not progress)
    with frozen_parameters(model.hf_model):
        for step in range(steps):
            idx = np.sort(rng.choice(train_rows, size=min(batch_tokens, train_rows.size), replace=False))
            with torch.no_grad():
                f_lp = log_softmax(model.decode(as_tensor(final[idx], device, model.dtype)).float())
                f_p = f_lp.exp()
                f_negent = (f_p * f_lp).sum(-1)
            opt.zero_grad(set_to_none=True)
            for i, l in enumerate(layers):
                h = as_tensor(states[l][idx], device, model.dtype)
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=mixed):
                    logits = decode(lens.translate(l, h))
                loss = kl_to_reference(logits, f_p, f_negent)  # one fused pass each way over the logits
                loss.backward()
                losses[step, i] = float(loss.detach())
            opt.step()
            bar.update(1)
    bar.close()
    lens.training_record = {"init": init, "steps": steps, "batch_tokens": batch_tokens, "lr": lr, "seed": seed,
                            "precision": "bfloat16 (mixed)" if mixed else "float32",
                            "n_train_tokens": int(train_rows.size), "optimizer": "Adam",
                            "first_loss": losses[0].tolist() if steps else [],
                            "last_loss": losses[-1].tolist() if steps else []}
    lens.loss_history_ = losses  # (step, layer): training KL per step
    return lens


def _bfloat16_decoder(model):
    """``model.decode`` for autocast training steps with the unembedding cast to bfloat16 once: autocast
    caches no cast of a frozen weight, so it would convert the d_vocab × d_model matrix on every call."""
    head = model.unembed_module
    if type(head) is not nn.Linear:
        return model.decode
    weight = head.weight.detach().to(torch.bfloat16)
    bias = None if head.bias is None else head.bias.detach().to(torch.bfloat16)

    def decode(x: torch.Tensor) -> torch.Tensor:
        return model.logit_factors(nn.functional.linear(model.pre_unembed(x).to(torch.bfloat16), weight, bias))

    return decode


def tuned_lens_metrics(model, lens: TunedLens, states: Mapping[int, object], final, next_token_ids,
                       **kwargs) -> LensResult:
    """:func:`lens.readout.logit_lens.lens_metrics` with the tuned lens' decoder."""
    kwargs.setdefault("device", model.device)
    kwargs.setdefault("dtype", torch.float32)
    return lens_metrics(states, final, next_token_ids, lens.readout(model), **kwargs)
