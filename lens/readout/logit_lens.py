"""Logit lens: read every layer's state through the model's own final norm and unembedding.

The logit lens (nostalgebraist 2020, "interpreting GPT: the logit lens") decodes an intermediate
residual state h_l as if it were the last one: ``logits_l = W_U · norm_f(h_l)``, with the model's own
final norm (RMSNorm for Llama-style models, LayerNorm for GPT-2) and its own unembedding (tied or
untied). Applied to the last layer's ``resid_post`` it *is* the model's output, which the tests and
the study check (``last_layer_max_abs_logit_diff``). The tuned lens (Belrose et al. 2023,
:mod:`lens.readout.tuned_lens`) reuses the same metrics with a learned translator before the decoding.

Conventions fixed here:

* The reference distribution ``p_final`` is the lens of the last layer (= the model's output).
  ``kl_to_final`` is KL(p_final ‖ p_layer) in nats, as in the tuned-lens paper.
* Cross-entropy and rank are taken against the true next token (``next_token_id``; rows with -1 —
  the end of a document — are not scored for them). Rank 0 means the true token is the lens' top-1.
* Per chunk, the reference layer is decoded once: its logits give its own metrics and then
  ``p_final``; every other layer is one unembedding, one fused pass of row statistics
  (:mod:`lens.readout.row_stats`) and a (token, d_model) dot product for the KL.
* Work is done in chunks of tokens: memory is bounded by ``chunk_size × d_vocab`` floats (a few
  such buffers), never ``layers × tokens × d_vocab``; per-token results kept are scalars per layer
  plus the top-k of a chosen subset of tokens.

Arrays are accepted as numpy arrays or torch tensors on any device; computation happens on the
model's device in float32, whatever the model's dtype: a model loaded in bfloat16 or float16 is
decoded through float32 copies of its final norm (and what follows it) and its unembedding upcast
to float32, so the lens' rounding is float32's and not the model's (:func:`decode_precision` says
what ran, for a result to record; :func:`last_layer_logit_diff` still compares in the model's dtype,
like with like).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from lens.readout.row_stats import EXP_FLOOR, _rowdot, log_softmax, row_stats, use_fused  # noqa: F401 (log_softmax re-exported)
from lens.errors import LensInputError
# the model's head as a lens reads it lives in lens.readout.head; its names stay importable from here
from lens.readout.head import Readout, _float32_head, as_tensor, decode_precision, model_readout, require_head  # noqa: F401

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LensResult:
    """Lens metrics per layer, and per token where the explorer needs them.

    Axes: ``layer`` follows ``layers``; ``token`` is every row of the states passed in (store
    order); ``row`` indexes ``topk_rows`` (the tokens whose top-k is kept); ``k`` the top-k slot.

    * ``ce``, ``kl_to_final``, ``top1_agreement``, ``entropy``, ``median_rank``, ``mean_rank``,
      ``top1_accuracy``: (layer,) — means over the scored tokens (``mask`` and a known next token;
      KL, entropy and agreement over ``mask``).
    * ``token_ce`` (layer, token) float32, NaN where the next token is unknown.
    * ``token_kl``, ``token_entropy`` (layer, token) float32.
    * ``token_rank`` (layer, token) int32, -1 where the next token is unknown.
    * ``token_top1`` (layer, token) int32: the lens' top-1 token id.
    * ``topk_rows`` (row,) int64; ``topk_ids`` (layer, row, k) int32; ``topk_probs`` (layer, row, k) float32.
    """

    layers: np.ndarray
    ce: np.ndarray
    kl_to_final: np.ndarray
    top1_agreement: np.ndarray
    top1_accuracy: np.ndarray
    entropy: np.ndarray
    median_rank: np.ndarray
    mean_rank: np.ndarray
    token_ce: np.ndarray
    token_kl: np.ndarray
    token_entropy: np.ndarray
    token_rank: np.ndarray
    token_top1: np.ndarray
    topk_rows: np.ndarray
    topk_ids: np.ndarray
    topk_probs: np.ndarray
    n_scored: int


def _validate(states: Mapping[int, object], final, targets, mask, n: int | None = None) -> int:
    if not states:
        raise LensInputError("the lens needs at least one layer of states; got none")
    n = n if n is not None else len(final)
    for layer, x in states.items():
        if len(x) != n:
            raise LensInputError(f"layer {layer} has {len(x)} token states, expected {n} (as many as the final layer)")
    if targets is not None and len(targets) != n:
        raise LensInputError(f"next_token_ids has {len(targets)} entries, expected {n}")
    if mask is not None and len(mask) != n:
        raise LensInputError(f"mask has {len(mask)} entries, expected {n}")
    return n


def lens_metrics(states: Mapping[int, object], final, next_token_ids, readout: Readout, *, device=None,
                 dtype=torch.float32, mask=None, chunk_size: int = 512, top_k: int = 10, topk_rows=None,
                 progress: bool = False, fused: bool | None = None) -> LensResult:
    """Metrics of ``readout`` for every layer in ``states`` against the readout of ``final``.

    ``states``: layer -> (token, d_model) array; ``final``: (token, d_model) last-layer states that
    define the reference distribution; ``next_token_ids``: (token,) int, -1 = unknown;
    ``mask``: (token,) bool, tokens that enter the per-layer means (default all);
    ``topk_rows``: rows whose top-``top_k`` tokens and probabilities are kept (default none);
    ``fused``: per-row softmax statistics through the compiled kernel of :mod:`lens.readout.row_stats`
    (default: on the CPU for large jobs; the numbers are the same either way).
    """
    n = _validate(states, final, next_token_ids, mask)
    tok = token_metrics(states, final, next_token_ids, readout, device=device, dtype=dtype, chunk_size=chunk_size,
                        top_k=top_k, topk_rows=topk_rows, progress=progress, fused=fused)
    return summarize(tok, next_token_ids, np.ones(n, bool) if mask is None else np.asarray(mask, dtype=bool))


@dataclass(frozen=True)
class TokenMetrics:
    """Per-token lens metrics before any mean (the ``token_*`` fields of :class:`LensResult`, axes
    (layer, token)), the reference's top-1 per token, and the kept top-k (``topk_*``)."""

    layers: np.ndarray
    ce: np.ndarray
    kl: np.ndarray
    entropy: np.ndarray
    rank: np.ndarray
    top1: np.ndarray
    final_top1: np.ndarray
    topk_rows: np.ndarray
    topk_ids: np.ndarray
    topk_probs: np.ndarray

    @classmethod
    def undecoded(cls, layers, n_tokens: int, top_k: int = 0) -> "TokenMetrics":
        """``n_tokens`` tokens none of which is decoded yet (NaN metrics, rank -1, top-1 0): the whole-store
        arrays :meth:`put` fills in; ``top_k`` > 0: every token's top-``top_k`` kept too (``topk_rows`` all
        of them; ``np.zeros`` pages in only the rows written), else none."""
        L, n = len(layers), n_tokens
        kept = n if top_k else 0
        return cls(layers=np.asarray(layers, np.int64), ce=np.full((L, n), np.nan, np.float32),
                   kl=np.full((L, n), np.nan, np.float32), entropy=np.full((L, n), np.nan, np.float32),
                   rank=np.full((L, n), -1, np.int32), top1=np.zeros((L, n), np.int32),
                   final_top1=np.zeros(n, np.int32), topk_rows=np.arange(kept, dtype=np.int64),
                   topk_ids=np.zeros((L, kept, top_k), np.int32), topk_probs=np.zeros((L, kept, top_k), np.float32))

    @property
    def top_k(self) -> int:
        """Slots of ``topk_ids`` / ``topk_probs``."""
        return int(self.topk_ids.shape[2])

    def put(self, rows: np.ndarray, tok: "TokenMetrics") -> None:
        """``tok``'s per-token metrics (of the tokens ``rows``) into these arrays, in place; when these keep
        every token's top-k (:meth:`undecoded` with ``top_k``) and ``tok`` kept every one of its rows' top-k in
        as many slots, those too."""
        for name in ("ce", "kl", "entropy", "rank", "top1"):
            getattr(self, name)[:, rows] = getattr(tok, name)
        self.final_top1[rows] = tok.final_top1
        if self.top_k and tok.top_k == self.top_k:
            self.topk_ids[:, rows] = tok.topk_ids
            self.topk_probs[:, rows] = tok.topk_probs

    def take(self, rows: np.ndarray, topk_rows: np.ndarray, topk_ids: np.ndarray,
             topk_probs: np.ndarray) -> "TokenMetrics":
        """The tokens ``rows``, with the top-k given (``topk_rows`` index ``rows``)."""
        return TokenMetrics(layers=self.layers, ce=self.ce[:, rows], kl=self.kl[:, rows],
                            entropy=self.entropy[:, rows], rank=self.rank[:, rows], top1=self.top1[:, rows],
                            final_top1=self.final_top1[rows], topk_rows=topk_rows, topk_ids=topk_ids,
                            topk_probs=topk_probs)


def summarize(tok: TokenMetrics, next_token_ids, mask: np.ndarray) -> LensResult:
    """Per-layer means of ``tok`` over ``mask`` (CE, rank, accuracy: over ``mask`` and a known next token)."""
    targets = np.asarray(next_token_ids, dtype=np.int64)
    scored = mask & (targets >= 0)
    if not scored.any():
        raise LensInputError("no token has a known next token inside the mask: expected at least one scored token")
    agree = tok.top1 == tok.final_top1[None, :]
    return LensResult(
        layers=np.asarray(tok.layers, np.int64),
        ce=tok.ce[:, scored].mean(1).astype(np.float64),
        kl_to_final=tok.kl[:, mask].mean(1).astype(np.float64),
        top1_agreement=agree[:, mask].mean(1),
        top1_accuracy=(tok.rank[:, scored] == 0).mean(1),
        entropy=tok.entropy[:, mask].mean(1).astype(np.float64),
        median_rank=np.median(tok.rank[:, scored], axis=1).astype(np.float64),
        mean_rank=tok.rank[:, scored].mean(1).astype(np.float64),
        token_ce=tok.ce, token_kl=tok.kl, token_entropy=tok.entropy, token_rank=tok.rank, token_top1=tok.top1,
        topk_rows=tok.topk_rows, topk_ids=tok.topk_ids, topk_probs=tok.topk_probs, n_scored=int(scored.sum()),
    )


class _Decoded:
    """The per-token results of one :func:`token_metrics` call as they are filled in, on the device the states
    are decoded on (they come to the host once, at the end: :meth:`host`)."""

    def __init__(self, n_layers: int, n: int, n_kept: int, top_k: int, device):
        L = n_layers
        self.out = {k: torch.full((L, n), float("nan"), dtype=torch.float32, device=device) for k in ("ce", "kl", "ent")}
        self.rank = torch.full((L, n), -1, dtype=torch.int32, device=device)
        self.top1 = torch.zeros((L, n), dtype=torch.int32, device=device)
        self.final_top1 = torch.zeros(n, dtype=torch.int32, device=device)
        self.tk_ids = torch.zeros((L, n_kept, top_k), dtype=torch.int32, device=device)
        self.tk_probs = torch.zeros((L, n_kept, top_k), dtype=torch.float32, device=device)

    def host(self, layers: list[int], kept_rows: np.ndarray) -> TokenMetrics:
        out = {k: v.cpu().numpy() for k, v in self.out.items()}
        return TokenMetrics(layers=np.asarray(layers, np.int64), ce=out["ce"], kl=out["kl"], entropy=out["ent"],
                            rank=self.rank.cpu().numpy(), top1=self.top1.cpu().numpy(),
                            final_top1=self.final_top1.cpu().numpy(), topk_rows=kept_rows,
                            topk_ids=self.tk_ids.cpu().numpy(), topk_probs=self.tk_probs.cpu().numpy())


@dataclass(frozen=True)
class _Pass:
    """What every chunk of one :func:`token_metrics` call decodes with."""

    readout: Readout
    layers: list
    ref_layer: int | None  # a layer whose states are the reference's: read from the reference logits
    W32: torch.Tensor
    b32: torch.Tensor | None
    capped: bool  # a soft cap: Σ p_f · logits is summed over the vocabulary
    buf: torch.Tensor  # one logits buffer, reused
    fused: bool
    top_k: int
    device: torch.device
    dtype: torch.dtype


def _topk_slots(topk_rows, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the rows whose top-k is kept, each token's slot among them or -1)."""
    rows = np.zeros(0, np.int64) if topk_rows is None else np.asarray(topk_rows, dtype=np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise LensInputError(f"topk_rows must index the {n} tokens; got range {rows.min()}..{rows.max()}")
    row_slot = np.full(n, -1, np.int64)
    row_slot[rows] = np.arange(rows.size)
    return rows, row_slot


@torch.inference_mode()
def token_metrics(states: Mapping[int, object], final, next_token_ids, readout: Readout, *, device=None,
                  dtype=torch.float32, chunk_size: int = 512, top_k: int = 10, topk_rows=None,
                  progress: bool = False, fused: bool | None = None) -> TokenMetrics:
    """The per-token part of :func:`lens_metrics` (same arguments, no mask): every token's metrics
    depend on that token's states only, so any set of tokens can be decoded apart and joined."""
    n = _validate(states, final, next_token_ids, None)
    if chunk_size < 1:
        raise LensInputError(f"chunk_size must be at least 1, got {chunk_size}")
    layers = sorted(states)
    targets = np.asarray(next_token_ids, dtype=np.int64)
    rows, row_slot = _topk_slots(topk_rows, n)
    L = len(layers)
    device = torch.device(device) if device is not None else readout.weight.device
    # per-token results stay where the states are decoded and come to the host once, at the end
    acc = _Decoded(L, n, rows.size, top_k, device)
    fused = use_fused(device, n * L, fused)
    W32 = readout.weight.float()
    # the lens of a layer whose states are the reference's is the reference's own decoding: read it
    # from the reference logits instead of decoding (and normalising) the last layer twice per chunk
    ref_layer = next((l for l in reversed(layers) if states[l] is final), None) if readout.layer_free else None
    p = _Pass(readout=readout, layers=layers, ref_layer=ref_layer, W32=W32,
              b32=readout.bias.float() if readout.bias is not None else None, capped=readout.softcap is not None,
              buf=torch.empty(min(chunk_size, n), W32.shape[0], device=device), fused=fused, top_k=top_k,
              device=device, dtype=dtype)

    bar = tqdm(total=n * L, unit="tok·layer", desc="lens", disable=not progress)
    for lo in range(0, n, chunk_size):
        hi = min(lo + chunk_size, n)
        _decode_chunk(p, acc, states, final, lo, hi, targets[lo:hi], row_slot[lo:hi], bar)
    bar.close()
    return acc.host(layers, rows)


def _decode_chunk(p: _Pass, acc: _Decoded, states, final, lo: int, hi: int, tgt_np: np.ndarray,
                  slots: np.ndarray, bar) -> None:
    """Every metric of tokens ``lo..hi`` at every layer into ``acc``."""
    device, out = p.device, acc.out
    has_tgt = torch.as_tensor(tgt_np >= 0, device=device)
    tgt = torch.as_tensor(np.where(tgt_np >= 0, tgt_np, 0), device=device)[:, None]
    keep = np.nonzero(slots >= 0)[0]
    # the kept rows as a slice when they are contiguous (the usual first-N tokens): no copy
    kk = (slice(int(keep[0]), int(keep[-1]) + 1) if keep.size and keep[-1] - keep[0] + 1 == keep.size
          else torch.as_tensor(keep, device=device))
    kslot = torch.as_tensor(slots[keep], device=device)

    def scores(i, logits):
        """Every metric of layer ``i`` but the KL from its ``logits``; returns log Z."""
        t_logit = logits.gather(1, tgt)[:, 0]
        mx, am, z, es, rk = row_stats(logits, t_logit, p.fused)
        # log p = logits − lse: CE = lse − logit_t, H = lse − Σ p·logits = log z − Σ e·s / z with
        # s = logits − max, e = exp(s)
        log_z = z.log()
        lse = mx + log_z
        out["ce"][i, lo:hi] = torch.where(has_tgt, lse - t_logit, torch.nan)
        out["ent"][i, lo:hi] = log_z - es / z
        acc.rank[i, lo:hi] = torch.where(has_tgt, rk, -1)
        acc.top1[i, lo:hi] = am
        if keep.size:
            pv, pi = logits[kk].topk(p.top_k, dim=-1)
            acc.tk_probs[i, kslot] = (pv - lse[kk, None]).exp()
            acc.tk_ids[i, kslot] = pi.to(torch.int32)
        return mx, am, z, lse

    def kl(i, x, logits, lse):
        # KL = Σ p_f log p_f − (Σ p_f·logits − lse), the cross term through q = p_f · W
        cross = _rowdot(f_p, logits) if p.capped else _rowdot(x.float(), q) + qb
        out["kl"][i, lo:hi] = (f_negent - (cross - lse)).clamp_min(0)

    readout, layers, ref_layer = p.readout, p.layers, p.ref_layer
    f_x = readout.pre(None, as_tensor(final[lo:hi], device, p.dtype)).float()
    f_logits = readout.logits(f_x, out=p.buf if not p.capped else None)
    if ref_layer is not None:
        i_ref = layers.index(ref_layer)
        f_max, f_top1, f_z, f_lse = scores(i_ref, f_logits)
    else:
        f_max, f_top1 = f_logits.max(-1)
        f_z = f_lse = None
    if p.capped:  # Σ p_f · logits must be summed over the vocabulary: keep p_f
        f_lse = torch.logsumexp(f_logits, -1)
        f_p = (f_logits - f_lse[:, None]).exp_()
        f_negent = _rowdot(f_p, f_logits) - f_lse
    else:
        # p_f and q = p_f · W: for any layer Σ_v p_f,v · logits_v = x · q + p_f · b. In place (buf is
        # free again after q); the 1 / z is applied to the (token, d_model) products, not to p_f.
        e = f_logits.sub_(f_max[:, None]).clamp_min_(EXP_FLOOR).exp_()
        if f_z is None:
            f_z = e.sum(-1)
        q = (e @ p.W32).div_(f_z[:, None])
        qb = (e @ p.b32).div_(f_z) if p.b32 is not None else 0.0
        f_p = None
        f_negent = _rowdot(f_x, q) + qb - (f_max + f_z.log())  # Σ p_f log p_f, shared by every layer's KL
    acc.final_top1[lo:hi] = f_top1
    for i, layer in enumerate(layers):
        if layer == ref_layer:
            kl(i, f_x, f_logits, f_lse)  # (f_logits is only read under a soft cap, where it is intact)
        else:
            x = readout.pre(layer, as_tensor(states[layer][lo:hi], device, p.dtype))
            logits = readout.logits(x, out=p.buf)
            _, _, _, lse = scores(i, logits)
            kl(i, x, logits, lse)
        bar.update(hi - lo)


def logit_lens(model, states: Mapping[int, object], final, next_token_ids, **kwargs) -> LensResult:
    """The logit lens of every layer in ``states`` (see :func:`lens_metrics` for the arguments).

    ``model`` is a :class:`lens.LoadedModel`; an encoder without an LM head raises LensInputError.
    """
    kwargs.setdefault("device", model.device)
    kwargs.setdefault("dtype", torch.float32)
    return lens_metrics(states, final, next_token_ids, model_readout(model), **kwargs)


@torch.inference_mode()
def decode_chunked(model, x, chunk_size: int = 512, device=None) -> Sequence[torch.Tensor]:
    """Plain decoding of ``x`` in chunks (the benchmark's baseline: one unembedding, no metrics)."""
    require_head(model)
    device = device or model.device
    return [model.decode(as_tensor(x[lo:lo + chunk_size], device)) for lo in range(0, len(x), chunk_size)]


@torch.inference_mode()
def last_layer_logit_diff(model, final, token_ids, windows, *, max_windows: int = 4) -> float:
    """Max |lens(last layer) − model logits| over the first ``max_windows`` windows
    (:func:`last_layer_logit_check`'s first number)."""
    return last_layer_logit_check(model, final, token_ids, windows, max_windows=max_windows)[0]


def last_layer_logit_check(model, final, token_ids, windows, *, max_windows: int = 4) -> tuple[float, float]:
    """(max |lens(last layer) − model logits|, max |model logit|) over the first ``max_windows`` windows.

    ``final``: (token, d_model) stored ``resid_post`` of the last layer; ``token_ids`` and
    ``windows``: (token,) columns of the store's token table. The model is re-run on each window's
    tokens exactly as captured, and its logits are compared with the decoded stored states. The logits'
    scale says what round-off to expect: two float32 products of a d_model-wide state agree to a few
    units in the last place of the largest logit, not to a fixed number of logits.
    """
    require_head(model)
    token_ids = np.asarray(token_ids)
    windows = np.asarray(windows)
    worst, scale = 0.0, 0.0
    for w in list(dict.fromkeys(windows.tolist()))[:max_windows]:
        rows = np.nonzero(windows == w)[0]
        ids = torch.as_tensor(token_ids[rows], device=model.device)[None]
        logits = model.hf_model(input_ids=ids, use_cache=False).logits[0].float()
        lens_logits = model.decode(as_tensor(final[rows], model.device, model.dtype)).float()
        worst = max(worst, float((logits - lens_logits).abs().max()))
        scale = max(scale, float(logits.abs().max()))
    return worst, scale
