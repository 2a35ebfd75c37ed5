"""Overview: the runs found under the results root, headline numbers, and a model card."""

import streamlit as st

from app.explorer import data, ui
from app.explorer.paths import UnsafePathError
from app.explorer.watch import job_panel
from lens.errors import LensInputError

st.title("Lens Workbench")
roots = ui.roots()
running = job_panel(detail=True)  # a main job still running: its studies, done / waiting, time left
found = ui.listed_or_stop(data.list_runs, lambda: st.info(
    f"no results under `{roots.results}` yet: " + ("they show here as each study finishes" if running else
                                                   f"run `lens study all --model smollm2-135m --corpus wiki-sample "
                                                   f"--out {roots.results}/smol`")))

runs = {}
for r in found:
    rec = r.record
    row = runs.setdefault(r.run, {"run": r.run, "model": rec.model, "corpus": rec.corpus,
                                  "tokens": rec.n_tokens, "studies": [], "date": rec.created[:19]})
    row["studies"].append(rec.study)
    row["date"] = max(row["date"], rec.created[:19])
st.subheader(f"{len(runs)} runs, {len(found)} results")
st.dataframe([{**v, "studies": ", ".join(v["studies"])} for v in runs.values()], hide_index=True)
wrong = data.silently_wrong_results(found)  # results read from a store whose capture is not the model's forward
if wrong:
    st.error(f"{len(wrong)} result(s) computed from a store whose fidelity check is SILENTLY WRONG; their verdicts are "
             "marked and cannot carry a claim:\n\n" + "\n".join(f"- `{run}` {study}: {mark}" for run, study, mark in wrong))
unreadable = data.unreadable_runs(roots.results)
if unreadable:
    st.warning(f"{len(unreadable)} results folder(s) left out, their record cannot be read (run the study again):\n\n"
               + "\n".join(f"- `{folder}`: {why}" for folder, why in unreadable))

st.subheader("Judged findings")
st.caption("each seed claim beside our measured value (with its 95% interval where the study has one) and the "
           "verdict of the one rule its study declares (the paper's threshold; studies/<study>/declaration.py)")
ui.findings_table([row for r in found for row in ui.findings_rows(r, with_run=True)], key="overview-findings")

st.subheader("Headline numbers")
from studies.reporting.headlines import headlines_for  # noqa: E402

rows = []
for r in found:
    for h in headlines_for(r.record):
        rows.append({"run": r.run, "study": r.record.study, "measure": h["label"], "ours": h["text"],
                     "seed claim": h["claim"]})
st.dataframe(rows, hide_index=True)

st.subheader("Model card")
models = sorted({r.record.model for r in found})
model = st.selectbox("model", models, key="overview-model")
card = {"model": model}
stores = []
try:
    stores = [("results", s) for s in data.list_stores(roots.results)] + \
             [("stores", s) for s in data.list_stores(roots.stores)]
except UnsafePathError as exc:
    st.error(str(exc))
for where, rel in stores:
    try:
        m = data.store_manifest(getattr(roots, where), rel)
    except LensInputError:  # a damaged store describes no model (the Nearest tokens page says what is wrong)
        continue
    if m.get("model", {}).get("model_id") == model:
        card.update({k: v for k, v in m["model"].items() if k != "model_id"})
        card["store"] = f"{where}/{rel}"
        card["tokens in store"] = m.get("n_tokens")
        card["corpus"] = m.get("corpus", {}).get("name")
        fidelity = data.store_fidelity(m)  # the capture's check against Hugging Face (lens.store.fidelity)
        card["store fidelity"] = fidelity[0]
        break
mine = [r.record for r in found if r.record.model == model]
card["studies"] = ", ".join(sorted({r.study for r in mine}))
card["library versions"] = ", ".join(f"{k} {v}" for k, v in sorted(mine[0].versions.items()))
card["git revision"] = mine[0].git_revision
st.dataframe([{"field": k, "value": str(v)} for k, v in card.items()], hide_index=True)
if "store fidelity" in card:
    with st.expander(f"fidelity record of {card['store']}: {card['store fidelity'].split(':')[0]}"):
        st.caption("at capture, the first windows re-run through the plain Hugging Face forward and compared with "
                   "what the store holds: per site kind, the last layer's lens against the logits")
        st.code("\n".join(fidelity), language=None)
