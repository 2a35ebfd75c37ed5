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
    wanted = st.query_params.get("run")  # a link to one result (app/links.py: the findings' figure links)
    if key not in st.session_state and wanted in [r.rel for r in found]:
        st.session_state[key] = [r.rel for r in found].index(wanted)
    i = where.selectbox(label or f"{study} run", range(len(found)), format_func=lambda j: labels[j], key=key)
    return found[i or 0]


def metric_values(rec, name: str) -> np.ndarray:
    """A per-layer metric of a result record as floats (NaN for missing values; empty if absent)."""
    return rec.metric(name) if name in rec.metrics else np.zeros(0)


def label(study: str, key: str, unit: bool = True) -> str:
    """``key``'s declared human label (with its unit), the key itself for an undeclared name."""
    spec = data.spec(study)
    return key if spec is None else spec.label(key, unit=unit)


def axis_title(study: str) -> str:
    """The declared layer axis of ``study``'s results (``layer`` for an undeclared study)."""
    spec = data.spec(study)
    return "layer" if spec is None else spec.layer_axis.title


def layer_figure(rec, names, title: str, *, log_y: bool = False, band: tuple | None = None,
                 y_title: str = "", hline: dict | None = None) -> go.Figure | None:
    """Per-layer metrics ``names`` of a result record as lines; ``band`` = (low, high) metric names.
    Legends, hovers and axis titles come from the study's declaration (labels, units, layer axis);
    ``y_title`` overrides the y axis title (default: the metrics' shared unit)."""
    names = [n for n in names if n in rec.metrics]
    if not names:
        return None
    spec = data.spec(rec.study)
    units = {"" if spec is None else spec.unit(n) for n in names}
    unit = units.pop() if len(units) == 1 else ""
    # a rank is 0 for the top-1: on a log axis it is drawn as rank + 1, so the top-1 is not dropped
    shift = 1.0 if log_y and unit.startswith("rank") else 0.0
    y_title = y_title or (f"{unit} + 1 (log scale)" if shift else unit)
    x = rec.layers
    fig = go.Figure()
    if band and all(b in rec.metrics for b in band):
        lo, hi = metric_values(rec, band[0]) + shift, metric_values(rec, band[1]) + shift
        fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1], y=list(hi) + list(lo)[::-1], fill="toself",
                                 line=dict(width=0), opacity=0.25, hoverinfo="skip", name="95% interval"))
    for n in names:
        shown = label(rec.study, n, unit=False)
        fig.add_trace(go.Scatter(x=x, y=metric_values(rec, n) + shift, mode="lines+markers", name=shown,
                                 hovertemplate=f"{html_safe(shown)}: %{{y:.4g}} {html_safe(unit)}"
                                               f"<br>layer %{{x}}<extra></extra>"))
    for text, y in (hline or {}).items():
        if y is not None and math.isfinite(float(y)):
            fig.add_hline(y=float(y), line_dash="dot", annotation_text=text)
    if len(x) <= 40:
        ticks = [str(l) if spec is None else spec.layer_axis.tick(l) for l in x]
        fig.update_xaxes(tickmode="array", tickvals=list(x), ticktext=ticks)  # whole layers only
    fig.update_layout(title=title, xaxis_title=axis_title(rec.study), yaxis_title=y_title, height=440,
                      margin=dict(l=60, r=20, t=90, b=50),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0))
    if log_y:  # one labelled tick per power of ten (1, 10, 100, 1k): the default's 2/5 minor labels crowd
        fig.update_yaxes(type="log", dtick=1, tickformat="~s", minor=dict(ticks="inside", showgrid=False))
    return fig


def html_safe(text: str) -> str:
    """Text for a plotly hover template (``%`` and braces would be read as placeholders)."""
    return text.replace("%", "%%").replace("{", "(").replace("}", ")")


def show(fig, key: str) -> None:
    if fig is not None:
        st.plotly_chart(fig, key=key)


def summary_table(rec) -> None:
    from studies.headlines import format_value

    rows = [{"measure": label(rec.study, k, unit=False),
             "value": format_value(v) if not isinstance(v, (dict, list)) else str(v)[:120],
             "unit": "" if data.spec(rec.study) is None else data.spec(rec.study).unit(k), "key": k}
            for k, v in rec.summary.items()]
    if rows:
        st.dataframe(rows, hide_index=True)


def headline_table(rec) -> None:
    from studies.headlines import headlines_for

    heads = headlines_for(rec)
    if heads:
        st.dataframe([{"measure": h["label"], "ours": h["text"], "seed claim": h["claim"]} for h in heads],
                     hide_index=True)


VERDICT_MARK = {"agrees": "agrees", "weaker": "weaker", "contradicts": "CONTRADICTS",
                "not applicable": "n/a (not measured)"}


def findings_rows(run: data.Run, with_run: bool = False) -> list[dict]:
    """The judged claims of one result (studies.headlines.judged) as table rows, each with a link to
    the page and figure that show it."""
    from app.links import figure_href
    from studies.headlines import judged

    rows = []
    for j in judged(run.record):
        row = {"run": run.run} if with_run else {}
        row.update({"study": run.record.study, "measure": j["measure"],
                    "ours": f"{j['text']} {j['unit']}".strip(), "95% interval": j["interval"],
                    "verdict": VERDICT_MARK.get(j["verdict"], j["verdict"]), "rule": j["rule"],
                    "seed claim": f"{j['claim']} ({j['source']})",
                    "figure": figure_href(run.record.study, run.rel, j["figure"])})
        rows.append(row)
    return rows


def findings_table(rows: list[dict], key: str) -> None:
    if rows:
        st.dataframe(rows, hide_index=True, key=key, column_config={
            "figure": st.column_config.LinkColumn("figure", display_text="open figure")})


def findings(run: data.Run, key: str) -> None:
    """This result's seed claims, each judged by its declared rule (value, interval, verdict)."""
    rows = findings_rows(run)
    if rows:
        st.markdown("**Judged findings** — each claim's verdict from one declared rule (the paper's threshold)")
        findings_table([{k: v for k, v in r.items() if k != "study"} for r in rows], key)


def saved_figures(run: data.Run, key: str, skip=()) -> None:
    """The figures the study saved, re-rendered from their plotly JSON."""
    from app.links import figure_anchor

    figs = data.load_figures(roots().results, run.rel)
    for name, fig in figs.items():
        if name in skip:
            continue
        st.markdown(f"<a id='{figure_anchor(run.rel, name)}'></a>", unsafe_allow_html=True)
        st.plotly_chart(go.Figure(fig), key=f"{key}-fig-{name}")


def generic_result(run: data.Run, key: str) -> None:
    """Any study: its headlines, a chooser over its per-layer metrics, its summary and its figures."""
    rec = run.record
    headline_table(rec)
    names = list(rec.metrics)
    if names:
        chosen = st.multiselect("metrics", names, default=names[:3], key=f"{key}-metrics",
                                format_func=lambda n: label(rec.study, n))
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
