"""Two views of depth on one figure (issue #40): He & Su's prediction residual per layer ("every layer contributes
equally": log PR falls linearly) beside Csordás et al.'s depth use (each block's update relative to the residual,
and the output cross-entropy change of skipping it). Built from two results alone; imports no torch.

Axes: prediction gains' ``layer`` is the output of block l (resid_post), depth use's is block l (its update
h_{l+1} − h_l lands in resid_post of block l), so both share the block axis."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from studies.depth_use.declaration import M as DU, S as DUS
from studies.prediction_gains.declaration import M as PG

__all__ = ["matching_depth_use", "depth_beside_gains"]


def matching_depth_use(pg_record, depth_runs: list):
    """The depth-use run of the same model and corpus as the prediction-gains record (the newest of those listed
    first), else of the same model, else None."""
    same = [r for r in depth_runs if r.record.model == pg_record.model]
    both = [r for r in same if r.record.corpus == pg_record.corpus]
    return (both or same or [None])[0]


def _values(metrics: dict, key: str) -> np.ndarray | None:
    v = metrics.get(key)
    return None if v is None else np.asarray([np.nan if x is None else x for x in v], float)


def depth_beside_gains(pg_record, du_record) -> go.Figure:
    """Top: held-out PR and the paper's-recipe PR per layer (log scale). Bottom: relative update per block (whole
    block, attention, MLP where present) and Δ cross-entropy of skipping the block."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("He & Su: prediction residual PR per layer (log)",
                                        "Csordás et al.: relative update ‖h_{l+1} − h_l‖ / ‖h_l‖ and Δ CE of a skip"),
                        specs=[[{}], [{"secondary_y": True}]])
    x = list(pg_record.layers)
    for key, name in ((PG.pr, "PR (held out)"), (PG.pr_token_id, "PR (paper's recipe)")):
        y = _values(pg_record.metrics, key)
        if y is not None:
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name), 1, 1)
    fig.update_yaxes(type="log", title_text="PR", row=1, col=1)
    if du_record is None:
        fig.add_annotation(text="no depth-use result of this model: run `lens study depth-use`", row=2, col=1,
                           showarrow=False, x=0.5, y=0.5, xref="x domain", yref="y domain")
        fig.update_layout(template="plotly_white", title="Prediction gains and depth use")
        return fig
    xd = list(du_record.layers)
    for key, name, dash in ((DU.rel_contribution, "relative update (attention + MLP)", None),
                            (DU.rel_attn, "attention", "dot"), (DU.rel_mlp, "MLP", "dot")):
        y = _values(du_record.metrics, key)
        if y is not None:
            fig.add_trace(go.Scatter(x=xd, y=y, mode="lines+markers" if dash is None else "lines", name=name,
                                     line=dict(dash=dash)), 2, 1, secondary_y=False)
    ce = _values(du_record.metrics, DU.skip_delta_ce)
    if ce is not None:
        fig.add_trace(go.Scatter(x=xd, y=ce, mode="lines+markers", name="Δ CE, block skipped (nats/token)",
                                 line=dict(dash="dash")), 2, 1, secondary_y=True)
    fig.update_yaxes(type="log", title_text="relative update", row=2, col=1, secondary_y=False)
    fig.update_yaxes(title_text="Δ CE (nats/token)", row=2, col=1, secondary_y=True)
    fig.update_xaxes(title_text="block l (its output, resid_post)", row=2, col=1)
    ratio = du_record.summary.get(DUS.second_half_ratio)
    parts = du_record.summary.get(DUS.parts)
    note = "" if parts in (None, "present") else " — attention / MLP parts " + str(parts)
    fig.update_layout(template="plotly_white", height=650,
                      title=f"Prediction gains and depth use — {pg_record.model}: second half / first half "
                            f"relative update {'n/a' if ratio is None else f'{ratio:.2f}'}{note}")
    return fig
