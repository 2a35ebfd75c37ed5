"""Studies: any study's results, registered or not — what it declares (names, axes, meaning), its
headlines, its per-layer metrics, summary and saved figures. A new study shows up here (and on the
Overview, Compare and Token view pages) without a page of its own."""

import streamlit as st

from app.explorer import data, ui
from studies.core.registry import available, declaration

st.title("Studies")
found = ui.listed_or_stop(data.list_runs, lambda: ui.missing("prediction-gains"))
names = sorted({r.record.study for r in found})
study = st.selectbox("study", names, format_func=lambda n: f"{n} — {available().get(n, 'not registered')}",
                     key="st-study")
run = ui.pick_result(study, key="st-run")
declared = declaration(study)
if declared is not None:
    with st.expander("what it declares"):
        spec = declared.result
        st.caption(f"layer axis: {spec.layer_axis}")
        st.dataframe([{"section": section, "name": f.name, "label": f.title, "unit": f.unit,
                       "axes": " × ".join(f.axes) or "scalar", "meaning": f.doc}
                      for section, fields in (("metric", spec.metrics), ("summary", spec.summary),
                                              ("array", spec.arrays)) for f in fields], hide_index=True)
if run is not None:
    ui.findings(run, key="st-findings")
    ui.generic_result(run, "st-generic", draw_figures=True)  # this page is there to show them
