"""Massive activations: per layer, the few channels whose magnitude dwarfs the rest (Sun et al. 2024, "Massive
Activations in Large Language Models": a handful of activations up to thousands of times the median, at the first
position and a few delimiter tokens, acting as fixed biases and feeding the attention sink).

Per layer, over the tokens given (every position, the first included — the filter the geometry studies share,
``skip_first``, is what removes them there): each channel's largest magnitude max_t |x_tc|; the ``k`` channels
with the largest; each one's ratio to the layer's median magnitude (the median of |x_tc| over every token and
channel, the paper's reference); the window position and the share of its top-10 magnitudes found at position 0.
Arrays in, a frozen result out; no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["MassiveActivations", "massive_activations"]


@dataclass(frozen=True)
class MassiveActivations:
    """Axes: ``layer``; ``rank`` (0 = the largest channel). ``channel`` (layer, rank): channel ids; ``max_abs``
    (layer, rank): their largest |x|; ``ratio`` (layer, rank): max_abs / ``median_abs`` (layer,); ``position``
    (layer, rank): the window position of that largest value; ``first_share`` (layer, rank): the share of the
    channel's ten largest |x| that sit at position 0; ``first_norm_ratio`` (layer,): mean state norm at position 0
    over the mean at the other positions (NaN when either is missing)."""

    channel: np.ndarray
    max_abs: np.ndarray
    median_abs: np.ndarray
    ratio: np.ndarray
    position: np.ndarray
    first_share: np.ndarray
    first_norm_ratio: np.ndarray


def massive_activations(layers, positions, k: int = 4, top: int = 10) -> MassiveActivations:
    """``layers``: a sequence of (token, d) arrays or tensors (one per layer, the same tokens); ``positions``
    (token,): each token's window position. ``k``: channels reported per layer; ``top``: the largest values
    of a channel ``first_share`` reads."""
    pos = np.asarray(positions)
    if not len(layers):
        raise ValueError("layers: expected at least one layer")
    first = torch.from_numpy(pos == 0)
    out = {key: [] for key in ("channel", "max_abs", "median", "position", "first_share", "norm_ratio")}
    for x in layers:
        x = torch.as_tensor(x).float().abs()
        if x.ndim != 2 or x.shape[0] != len(pos):
            raise ValueError(f"layers: expected (token, d) arrays of {len(pos)} tokens, got {tuple(x.shape)}")
        kk = min(k, x.shape[1])
        col_max, arg = x.max(0)
        val, ch = col_max.topk(kk)
        median = float(x.flatten().median()) if x.numel() < (1 << 24) else float(
            x.flatten()[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))[:1 << 24]].median())
        n_top = min(top, x.shape[0])
        shares = [float(first[x[:, c].topk(n_top).indices].float().mean()) for c in ch.tolist()]
        norms = x.norm(dim=1)
        a, b = norms[first], norms[~first]
        out["channel"].append(ch.numpy())
        out["max_abs"].append(val.numpy().astype(np.float64))
        out["median"].append(median)
        out["position"].append(pos[arg[ch].numpy()])
        out["first_share"].append(shares)
        out["norm_ratio"].append(float(a.mean() / b.mean()) if len(a) and len(b) else float("nan"))
    median = np.asarray(out["median"], np.float64)
    max_abs = np.stack(out["max_abs"])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = max_abs / median[:, None]
    return MassiveActivations(channel=np.stack(out["channel"]).astype(np.int64), max_abs=max_abs, median_abs=median,
                              ratio=ratio, position=np.stack(out["position"]).astype(np.int64),
                              first_share=np.asarray(out["first_share"], np.float64),
                              first_norm_ratio=np.asarray(out["norm_ratio"], np.float64))
