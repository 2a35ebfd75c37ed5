"""Widgets and plots the explorer's pages share; generic over result.json keys."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import data
from app.paths import UnsafePathError
from app.state import get_roots


def roots():
    return get_roots()


def missing(study: str, what: str = "") -> None:
    st.info(f"no results for {study} yet{': ' + what if what else ''}: run "
            f"`lens study {study} --model smollm2-135m --out {roots().results}/<run>/{study}` "
            f"(or `lens study all ... --out {roots().results}/<run>`)")


def run_label(r: data.Run) -> str:
    rec = r.record
    return f"{r.run} · {rec.model} · {rec.corpus} · {rec.n_tokens} tokens"


def listed_or_stop(read, when_empty) -> list:
    """``read(results_root)`` (the runs, the per-token sources, ...); the page stops with the path
    error, or after ``when_empty()`` showed a hint, when that fails or finds nothing."""
    try:
        found = read(roots().results)
    except UnsafePathError as exc:
        st.error(str(exc))
        st.stop()
    if not found:
        when_empty()
        st.stop()
    return found


def pick_result(study: str, key: str, label: str | None = None, where=st) -> data.Run | None:
    """A selectbox over the runs of ``study``; ``None`` (with a hint shown) when there are none."""
    try:
        found = data.runs_of(roots().results, study)
    except UnsafePathError as exc:
        st.error(str(exc))
        return None
    if not found:
        missing(study)
        return None
    labels = [run_label(r) for r in found]
    i = where.selectbox(label or f"{study} run", range(len(found)), format_func=lambda j: labels[j], key=key)
    return found[i or 0]


def metric_values(rec, name: str) -> np.ndarray:
    """A per-layer metric of a result record as floats (NaN for missing values; empty if absent)."""
    return rec.metric(name) if name in rec.metrics else np.zeros(0)


def layer_figure(rec, names, title: str, *, log_y: bool = False, band: tuple | None = None,
                 y_title: str = "", hline: dict | None = None) -> go.Figure | None:
    """Per-layer metrics ``names`` of a result record as lines; ``band`` = (low, high) metric names."""
    names = [n for n in names if n in rec.metrics]
    if not names:
        return None
    x = rec.layers
    fig = go.Figure()
    if band and all(b in rec.metrics for b in band):
        lo, hi = metric_values(rec, band[0]), metric_values(rec, band[1])
        fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1], y=list(hi) + list(lo)[::-1], fill="toself",
                                 line=dict(width=0), opacity=0.25, name=f"{band[0]}…{band[1]}", hoverinfo="skip"))
    for n in names:
        fig.add_trace(go.Scatter(x=x, y=metric_values(rec, n), mode="lines+markers", name=n))
    for label, y in (hline or {}).items():
        if y is not None and math.isfinite(float(y)):
            fig.add_hline(y=float(y), line_dash="dot", annotation_text=label)
    if len(x) <= 40:
        fig.update_xaxes(tickmode="array", tickvals=list(x))  # whole layers only
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title=y_title, height=420,
                      margin=dict(l=40, r=20, t=70, b=40),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0))
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def show(fig, key: str) -> None:
    if fig is not None:
        st.plotly_chart(fig, key=key)


def summary_table(rec) -> None:
    from studies.headlines import format_value

    rows = [{"key": k, "value": format_value(v) if not isinstance(v, (dict, list)) else str(v)[:120]}
            for k, v in rec.summary.items()]
    if rows:
        st.dataframe(rows, hide_index=True)


def headline_table(rec) -> None:
    from studies.headlines import headlines_for

    heads = headlines_for(rec)
    if heads:
        st.dataframe([{"measure": h["label"], "ours": h["text"], "seed claim": h["claim"]} for h in heads],
                     hide_index=True)


def saved_figures(run: data.Run, key: str, skip=()) -> None:
    """The figures the study saved, re-rendered from their plotly JSON."""
    figs = data.load_figures(roots().results, run.rel)
    for name, fig in figs.items():
        if name in skip:
            continue
        st.plotly_chart(go.Figure(fig), key=f"{key}-fig-{name}")


def generic_result(run: data.Run, key: str) -> None:
    """Any study: its headlines, a chooser over its per-layer metrics, its summary and its figures."""
    rec = run.record
    headline_table(rec)
    names = list(rec.metrics)
    if names:
        chosen = st.multiselect("metrics", names, default=names[:3], key=f"{key}-metrics")
        show(layer_figure(rec, chosen, f"{rec.study} — {rec.model}"), f"{key}-plot")
    with st.expander("summary"):
        summary_table(rec)
    with st.expander("saved figures"):
        saved_figures(run, key)


def layer_slider(layers, key: str, label: str = "layer"):
    layers = [int(l) for l in layers]
    if not layers:
        return None
    if len(layers) == 1:
        st.caption(f"{label}: {layers[0]}")
        return layers[0]
    if key in st.session_state:  # set by a deep link (app/links.py) or an earlier run: no default beside it
        return st.select_slider(label, options=layers, key=key)
    return st.select_slider(label, options=layers, value=layers[len(layers) // 2], key=key)
