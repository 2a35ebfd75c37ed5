"""Compare: two runs side by side on the same metric (two models, or a corpus and its transform)."""

import plotly.graph_objects as go
import streamlit as st

from app.explorer import data, ui

st.title("Compare")
found = ui.listed_or_stop(data.list_runs, lambda: ui.missing("prediction-gains"))
studies = sorted({r.record.study for r in found})
study = st.selectbox("study", studies, key="cmp-study")
mine = [r for r in found if r.record.study == study]
labels = [ui.run_label(r) for r in mine]
cols = st.columns(2)
a = cols[0].selectbox("run A", range(len(mine)), format_func=lambda j: labels[j], key="cmp-a")
b = cols[1].selectbox("run B", range(len(mine)), index=min(1, len(mine) - 1), format_func=lambda j: labels[j],
                      key="cmp-b")
metrics = [m for m in mine[a].record.metrics if m in mine[b].record.metrics]
if not metrics:
    st.warning("these two runs share no per-layer metric")
    st.stop()
metric = st.selectbox("metric", metrics, key="cmp-metric", format_func=lambda n: ui.label(study, n))
relative = st.checkbox("x axis as relative depth (for models of different depth)", key="cmp-rel")
fig = go.Figure()
for j, name in ((a, "A"), (b, "B")):
    x = [int(l) for l in mine[j].record.layers]
    if relative and len(x) > 1:
        x = [(l - x[0]) / (x[-1] - x[0]) for l in x]
    fig.add_trace(go.Scatter(x=x, y=ui.metric_values(mine[j].record, metric), mode="lines+markers",
                             name=f"{name}: {labels[j]}"))
spec = data.spec(study)
# the legend above the plot (a horizontal legend's default place, under it, covers the x axis title)
fig.update_layout(title=f"{study}: {ui.label(study, metric, unit=False)}",
                  xaxis_title="relative depth (0 = first, 1 = last)" if relative else ui.axis_title(study, mine[a].record, mine[b].record),
                  yaxis_title="" if spec is None else spec.unit(metric), height=480, margin=dict(t=110, b=60),
                  legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0.0))
st.plotly_chart(fig, key="cmp-plot")
for col, j, name in ((cols[0], a, "A"), (cols[1], b, "B")):
    with col:
        st.caption(f"{name}: {labels[j]}")
        ui.summary_table(mine[j].record)
