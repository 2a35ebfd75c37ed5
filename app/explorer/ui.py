"""Widgets and plots the explorer's pages share; generic over result.json keys."""

from __future__ import annotations

import math
import time

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app.explorer import data, links
from app.explorer.paths import UnsafePathError
from app.explorer.state import get_roots
from studies.reporting.headlines import format_value, headlines_for, judged, nested_text, verdict_text
from app.explorer.links import figure_href


def roots():
    return get_roots()


def missing(study: str, what: str = "") -> None:
    """The page's line when ``study`` has no results: what a main job under the results root is doing
    with it (running / waiting / failed, :func:`job_lines`), else how to make them."""
    lines = job_lines(study)
    if lines:
        for kind, text in lines:
            {"failed": st.error, "stopped": st.warning}.get(kind, st.info)(text)
        return
    st.info(f"no results for {study} yet{': ' + what if what else ''}: run "
            f"`lens study {study} --model smollm2-135m --out {roots().results}/<run>/{study}` "
            f"(or `lens study all ... --out {roots().results}/<run>`)")


def clock(seconds) -> str:
    """12 s, 4 min, 1 h 05 min."""
    s = max(0, int(round(float(seconds))))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def job_lines(study: str) -> list[tuple[str, str]]:
    """(status, one line) for every main job under the results root whose ``main_job.json`` lists
    ``study`` as running, waiting or failed: elapsed time and an estimate of what is left; ("stopped", ...)
    for a study a job left unfinished when it was interrupted (Ctrl-C, SIGTERM)."""
    try:
        jobs = data.job_states(roots().results)
    except UnsafePathError:
        return []
    out = []
    for job in jobs:
        for row in job["studies"]:
            if row.get("study") != study or row.get("status") not in ("running", "waiting", "failed"):
                continue
            status, where = row["status"], f"in run `{job['run']}`"
            est = row.get("estimate_s")
            if status == "failed":
                out.append((status, f"{study} failed {where}: {row.get('error') or row.get('line') or 'no error recorded'}"
                                    f" (details in {job['run']}/main_job.json; `lens study all ... --resume` runs it again)"))
                continue
            if job["finished"]:
                continue
            if job.get("stopped"):  # the job ended before this study did: nothing runs it now
                state = "was running" if status == "running" else "had not started"
                out.append(("stopped", f"{study} {state} {where} when the job was {job['stopped']}"))
                continue
            stale = f"; main_job.json last written {clock(job['updated_s'])} ago" if job["updated_s"] > 600 else ""
            if status == "running":
                started = row.get("started")
                ran = time.time() - float(started) if started else None
                text = f"{study} is running {where}"
                text += f": {clock(ran)} so far" if ran is not None else f" (job running for {clock(job['elapsed_s'])})"
                if est and ran is not None:
                    text += (f", about {clock(est - ran)} left of about {clock(est)} in all" if est > ran
                             else f", longer than the {clock(est)} estimated")
                elif est:
                    text += f", about {clock(est)} in all"
            else:
                text = f"{study} is waiting {where} (job running for {clock(job['elapsed_s'])})"
                text += f"; it should take about {clock(est)} once it starts" if est else ""
            out.append((status, text + stale + ". The page shows its results as soon as it finishes."))
    return out


def run_label(r: data.RunResult) -> str:
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


def pick_result(study: str, key: str, label: str | None = None, where=st) -> data.RunResult | None:
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
    options = list(range(len(found)))
    links.seed(key, options, links.RUN, encode=lambda j: found[j].run)
    i = where.selectbox(label or f"{study} run", options, format_func=lambda j: labels[j], key=key)
    run = found[i or 0]
    links.remember(links.RUN, run.run)
    downloads(run, key, where)
    return run


def downloads(run: data.RunResult, key: str, where=st) -> None:
    """Download buttons for the result's result.json and its arrays (.npz, written from the saved arrays
    on click: nothing is read until then)."""
    c1, c2, _ = where.columns([1, 1, 3])
    name = f"{run.run}-{run.record.study}".replace("/", "-")
    c1.download_button("result.json", lambda: data.result_json_bytes(roots().results, run.rel),
                       file_name=f"{name}-result.json", mime="application/json", key=f"{key}-dl-json",
                       on_click="ignore")
    c2.download_button("arrays (.npz)", lambda: data.arrays_npz_bytes(roots().results, run.rel),
                       file_name=f"{name}-arrays.npz", mime="application/octet-stream", key=f"{key}-dl-npz",
                       on_click="ignore")


def metric_values(rec, name: str) -> np.ndarray:
    """A per-layer metric of a result record as floats (NaN for missing values; empty if absent)."""
    return rec.metric(name) if name in rec.metrics else np.zeros(0)


def label(study: str, key: str, unit: bool = True) -> str:
    """``key``'s declared human label (with its unit), the key itself for an undeclared name."""
    spec = data.spec(study)
    return key if spec is None else spec.label(key, unit=unit)


def axis_title(study: str, *records) -> str:
    """The layer axis of ``study``'s result ``records`` as they recorded it (the site each run read; records
    on different sites name each), the declared axis for a record without one or for no record (``layer``
    for an undeclared study)."""
    spec = data.spec(study)
    if spec is None:
        return "layer"
    return " / ".join(dict.fromkeys(spec.axis(r).title for r in records)) or spec.layer_axis.title


def _band_name(study: str, low: str) -> str:
    """The legend of an interval band: its low end's declared label without "low" (each study says its level)."""
    text = label(study, low, unit=False)
    for end in (", low", " low"):
        if text.endswith(end):
            return text[: -len(end)]
    return "interval"


def narrow_log_ticks(values, most: int = 6) -> list[float] | None:
    """Tick values for a log axis over ``values`` spanning less than two powers of ten (a prediction residual from
    0.6 to 0.95 would get no labelled tick at one per power of ten): evenly spaced round numbers inside the range,
    at least two; None for a wider range (one tick per power of ten labels it) or no positive value."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return None
    lo, hi = float(v.min()), float(v.max())
    if hi / lo >= 100:
        return None
    if hi == lo:
        return [lo]
    if hi / lo >= 10:  # one to two powers of ten: 1, 2, 5 times each
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                 for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
        return [float(f"{t:.6g}") for t in ticks] if len(ticks) >= 2 else [lo, hi]
    raw = (hi - lo) / max(1, most - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks = [t for t in np.arange(math.ceil(lo / step) * step, hi + step / 2, step) if lo - 1e-12 <= t <= hi + 1e-12]
    if len(ticks) < 2:
        ticks = [lo, hi]
    return [float(f"{t:.6g}") for t in ticks]


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
    x = list(rec.layers)
    # traces and layout as plain dicts, validated once by go.Figure (add_trace / update_layout walk and
    # validate property paths one call at a time: 40 ms a figure, several figures a page)
    traces = []
    if band and all(b in rec.metrics for b in band):
        lo, hi = metric_values(rec, band[0]) + shift, metric_values(rec, band[1]) + shift
        traces.append(dict(type="scatter", x=x + x[::-1], y=list(hi) + list(lo)[::-1], fill="toself",
                           line=dict(width=0), opacity=0.25, hoverinfo="skip", name=_band_name(rec.study, band[0])))
    for n in names:
        shown = label(rec.study, n, unit=False)
        traces.append(dict(type="scatter", x=x, y=metric_values(rec, n) + shift, mode="lines+markers", name=shown,
                           hovertemplate=f"{html_safe(shown)}: %{{y:.4g}} {html_safe(unit)}"
                                         f"<br>layer %{{x}}<extra></extra>"))
    lines = [(text, float(y)) for text, y in (hline or {}).items() if y is not None and math.isfinite(float(y))]
    xaxis = dict(title=dict(text=axis_title(rec.study, rec)))
    if len(x) <= 40:  # whole layers only
        xaxis.update(tickmode="array", tickvals=x, ticktext=[str(l) if spec is None else spec.axis(rec).tick(l)
                                                            for l in x])
    yaxis = dict(title=dict(text=y_title))
    if log_y:  # one labelled tick per power of ten (1, 10, 100, 1k): the default's 2/5 minor labels crowd
        yaxis.update(type="log", dtick=1, tickformat="~s", minor=dict(ticks="inside", showgrid=False))
        ticks = narrow_log_ticks([v for t in traces for v in t["y"]])
        if ticks is not None:  # within one or two powers of ten those ticks are one or none: label values instead
            yaxis.update(tickmode="array", tickvals=ticks, ticktext=[f"{v:.3g}" for v in ticks])
            yaxis.pop("dtick")
    layout = dict(title=dict(text=title), xaxis=xaxis, yaxis=yaxis, height=440, margin=dict(l=60, r=20, t=90, b=50),
                  legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0),
                  shapes=[dict(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=y, y1=y, line=dict(dash="dot"))
                          for _, y in lines],
                  annotations=[dict(text=text, xref="x domain", x=1, xanchor="right", yref="y", y=y,
                                    yanchor="bottom", showarrow=False) for text, y in lines])
    return go.Figure(data=traces, layout=layout)


def html_safe(text: str) -> str:
    """Text for a plotly hover template (``%`` and braces would be read as placeholders)."""
    return text.replace("%", "%%").replace("{", "(").replace("}", ")")


def show(fig, key: str) -> None:
    if fig is not None:
        st.plotly_chart(fig, key=key)


def summary_table(rec) -> None:
    rows = [{"measure": label(rec.study, k, unit=False),
             "value": format_value(v) if not isinstance(v, (dict, list)) else str(v)[:120],
             "unit": "" if data.spec(rec.study) is None else data.spec(rec.study).unit(k), "key": k}
            for k, v in rec.summary.items()]
    if rows:
        st.dataframe(rows, hide_index=True)


def headline_table(rec) -> None:
    heads = headlines_for(rec)
    if heads:
        st.dataframe([{"measure": h["label"], "ours": h["text"], "seed claim": h["claim"]} for h in heads],
                     hide_index=True)


VERDICT_MARK = {"agrees": "agrees", "weaker": "weaker", "contradicts": "CONTRADICTS", "undecided": "undecided",
                "not applicable": "n/a"}


def findings_rows(run: data.RunResult, with_run: bool = False) -> list[dict]:
    """The judged claims of one result (studies.reporting.headlines.judged) as table rows, each with a link to
    the page and figure that show it."""
    rows = []
    for j in judged(run.record):
        row = {"run": run.run} if with_run else {}
        row.update({"study": run.record.study, "measure": j["measure"],
                    "ours": f"{j['text']} {j['unit']}".strip(), "95% interval": j["interval"],
                    "verdict": verdict_text({**j, "verdict": VERDICT_MARK.get(j["verdict"], j["verdict"])}),
                    "N/4 / N/2 / N": nested_text(j), "rule": j["rule"],
                    "paper's statistic": j["paper"], "ours": f"{j['text']} {j['unit']}".strip(),
                    "how ours is computed": j["method"],
                    "seed claim": f"{j['claim']} ({j['source']})",
                    "figure": figure_href(run.record.study, run.run, run.rel, j["figure"])})
        rows.append(row)
    return rows


def findings_table(rows: list[dict], key: str) -> None:
    if rows:
        st.dataframe(rows, hide_index=True, key=key, column_config={
            "figure": st.column_config.LinkColumn("figure", display_text="open figure")})


def findings(run: data.RunResult, key: str) -> None:
    """This result's seed claims, each judged by its declared rule (value, interval, verdict)."""
    rows = findings_rows(run)
    if rows:
        st.markdown("**Judged findings** — each claim's verdict from one declared rule (the paper's threshold)")
        findings_table([{k: v for k, v in r.items() if k != "study"} for r in rows], key)


def saved_figures(run: data.RunResult, key: str, skip=()) -> None:
    """The figures the study saved, re-rendered from their plotly JSON; the one a link names
    (:data:`app.explorer.links.FIGURE`) is scrolled to once drawn (the browser's own jump to ``#anchor`` comes before
    the page has drawn it)."""
    figs = data.load_figures(roots().results, run.rel)
    wanted = linked_figure(run)
    for name, fig in figs.items():
        if name in skip:
            continue
        anchor = links.figure_anchor(run.rel, name)
        st.markdown(f"<a id='{anchor}'></a>", unsafe_allow_html=True)
        st.plotly_chart(go.Figure(fig), key=f"{key}-fig-{name}")
        scrolled = st.session_state.setdefault("lens_figures_scrolled_to", set())
        if anchor == wanted and anchor not in scrolled:  # once per link: later reruns leave the scroll alone
            scrolled.add(anchor)
            # our own script, an id made of letters, digits and "-" (figure_anchor)
            st.html(f"<script>setTimeout(() => document.getElementById('{anchor}')?.scrollIntoView(), 300)</script>",
                    unsafe_allow_javascript=True)


def tabs(page: str) -> list:
    """The page's tabs (:data:`app.explorer.links.PAGE_TABS`), each built only while open (``with t: if t.open:``): a
    page draws one tab's figures instead of all of them, a switch reruns it. The URL's ``tab`` (a finding's
    link to a figure) opens one; the tab open is not written back to the URL."""
    titles = [t for t, _ in links.PAGE_TABS[page]]
    key = f"{page}-tab"
    links.seed(key, titles, links.TAB)
    return st.tabs(titles, key=key, on_change="rerun")


def linked_figure(run: data.RunResult) -> str | None:
    """The anchor of this result's saved figure that the URL's ``figure`` names (a finding's link), else None."""
    wanted = st.query_params.get(links.FIGURE)
    names = data.load_figures(roots().results, run.rel)
    return wanted if wanted in {links.figure_anchor(run.rel, n) for n in names} else None


def details(run: data.RunResult, key: str, draw_figures: bool = False) -> None:
    """:func:`generic_result` in an expander built only while open; opened (once per link) by a link to one
    of its figures."""
    anchor = linked_figure(run)
    if anchor and links.url_names(links.FIGURE, anchor):
        st.session_state[f"{key}-open"] = True
    box = st.expander("all metrics, summary and saved figures", key=f"{key}-open", on_change="rerun")
    with box:
        if box.open:
            generic_result(run, key, draw_figures)


def generic_result(run: data.RunResult, key: str, draw_figures: bool = False) -> None:
    """Any study: its headlines, a chooser over its per-layer metrics, its summary and its figures (drawn
    when asked, or when a link names one of them: rebuilding a saved plotly figure costs 10–250 ms, and a
    page holds several of these)."""
    rec = run.record
    headline_table(rec)
    names = list(rec.metrics)
    if names:
        chosen = st.multiselect("metrics", names, default=names[:3], key=f"{key}-metrics",
                                format_func=lambda n: label(rec.study, n))
        show(layer_figure(rec, chosen, f"{rec.study} — {rec.model}"), f"{key}-plot")
    with st.expander("summary"):
        summary_table(rec)
    figures_box(run, key, draw_figures)


def figures_box(run: data.RunResult, key: str, draw_figures: bool = True) -> None:
    """The result's saved figures in an expander, opened and drawn when the URL's ``figure`` names one of
    them (a finding's link); else drawn at once, or only when the reader asks (``draw_figures`` False)."""
    figs = data.load_figures(roots().results, run.rel)
    linked = linked_figure(run) is not None
    with st.expander("saved figures", expanded=linked):
        n = len(figs)
        if not n:
            st.caption("this result saved no figures")
        elif draw_figures or linked or st.toggle(f"draw the {n} saved figure{'s' * (n != 1)}",
                                                 key=f"{key}-draw-figures"):
            saved_figures(run, key)


def layer_slider(layers, key: str, label: str = "layer", param: str | None = links.LAYER):
    """A slider over the result's layers (the middle one first); ``param`` links it to the URL."""
    layers = [int(l) for l in layers]
    if not layers:
        return None
    if len(layers) == 1:
        st.caption(f"{label}: {layers[0]}")
        return layers[0]
    links.seed(key, layers, param, default=len(layers) // 2)
    layer = st.select_slider(label, options=layers, key=key)
    if param:
        links.remember(param, layer)
    return layer
