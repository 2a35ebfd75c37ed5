"""Write the probing notebooks from the cells below (run: `.venv/bin/python studies/notebooks/make_notebooks.py`).

Keeping the source here makes review and diffs easy; the .ipynb files are committed without outputs,
and tests/studies/test_notebooks.py executes them top to bottom on tiny-llama.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

QUICKSTART = [
    ("md", """# Quickstart: load, capture, analyse, plot

A small model (`tiny-llama`, random weights: swap in `smollm2-135m` for the real thing), a few hundred
tokens of the built-in `wiki-sample` corpus, one analysis (token linearity between consecutive layers),
one figure — and the same numbers written as a results folder the explorer and report can read."""),
    ("code", """import lens
import numpy as np
import plotly.graph_objects as go

MODEL, N_TOKENS = "tiny-llama", 512
model = lens.load_model(MODEL)
model.n_layers, model.d_model"""),
    ("md", "Capture the residual stream after every block into an in-memory store (`out=` a folder writes it to disk)."),
    ("code", """store = lens.capture(model, corpus="wiki-sample", sites=["resid_post"], max_tokens=N_TOKENS, progress=False)
print(store)
print("".join(store.tokens["token"][:40]))"""),
    ("md", """One analysis: the linearity score of the map from layer *l* to layer *l+1*
(LLM-Microscope / "Your Transformer is Secretly Linear": about 0.99 in trained models)."""),
    ("code", """from geometry import linearity_score

view = store.view("resid_post")   # every layer, read when indexed: view[i] is layer view.layers[i]
layers = view.layers
scores = [linearity_score(view[i].float(), view[i + 1].float(), ridge=1e-2) for i in range(len(view) - 1)]
np.round(scores, 3)"""),
    ("code", """fig = go.Figure(go.Scatter(x=layers[:-1], y=scores, mode="lines+markers"))
fig.update_layout(title=f"Linearity of layer l → l+1 — {MODEL}", xaxis_title="layer l", yaxis_title="score")
fig"""),
    ("md", """Save it as a results folder under the names the linearity study declares (`studies.linearity.M` /
`S`: the one place those names are spelled): `lens app --results <folder>` shows it on the Geometry page,
`lens report <folder>` puts it in a report. `lens study linearity` computes the full study the same way."""),
    ("code", """import tempfile
from studies.linearity import M, S
from studies.results import write_result, read_result

out = write_result(tempfile.mkdtemp() + "/quickstart", study="linearity", model=MODEL, corpus="wiki-sample",
                   n_tokens=store.n_tokens, layers=layers[:-1], metrics={M.linearity: scores},
                   summary={S.linearity_mean: float(np.mean(scores))}, figures={"main": fig})
read_result(out).summary"""),
]

PROBING = [
    ("md", """# Probing a hypothesis with the probe API

**Hypothesis.** A token's state says whether the *next* token will be punctuation — and says it more
clearly in later layers, where the model prepares its prediction. A linear probe per layer tests this;
Hewitt & Liang's control task (labels assigned at random per word type) tells whether the probe reads
the representation or just memorises word identities (*selectivity* = accuracy − control accuracy).

On `tiny-llama` (random weights) expect little; rerun with `MODEL = "smollm2-135m"` and more tokens to see
the real answer."""),
    ("code", """import lens
import numpy as np
from lens.text.token_classes import token_classes
from probes import LinearProbe

MODEL, N_TOKENS = "tiny-llama", 450
store = lens.capture(lens.load_model(MODEL), corpus="lee", sites=["resid_post"], max_tokens=N_TOKENS,
                     seq_len=64, progress=False)
tok = store.tokens
# folds grouped by window (a window never sits on both sides); with more tokens group by tok["doc"]
groups = tok["doc"] * 100_000 + tok["window"]
keep = tok["next_token_id"] >= 0                      # tokens that have a next token
next_text = np.empty(store.n_tokens, dtype=object)
next_text[:-1] = tok["token"][1:]
labels = (token_classes(next_text[keep].astype(str)) == "punctuation").astype(int)
print(f"{keep.sum()} tokens, {labels.mean():.1%} followed by punctuation")"""),
    ("code", """import torch

X = store.view("resid_post").astype(torch.float32).take(keep)   # lazy: one layer read at a time
probe = LinearProbe(kind="logistic", Cs=(1.0,), n_folds=3, max_iter=200, seed=0).fit(
    X, labels, word_types=tok["token_id"][keep], groups=groups[keep])
r = probe.result_
{"accuracy": np.round(r.accuracy, 3), "control": np.round(r.control_accuracy, 3),
 "selectivity": np.round(r.selectivity, 3), "majority": round(r.majority, 3), "best_layer": r.best_layer}"""),
    ("code", """import plotly.graph_objects as go

fig = go.Figure([go.Scatter(x=r.layers, y=r.accuracy, name="probe"),
                 go.Scatter(x=r.layers, y=r.control_accuracy, name="control task"),
                 go.Scatter(x=r.layers, y=[r.majority] * len(r.layers), name="majority", line=dict(dash="dot"))])
fig.update_layout(title="Is the next token punctuation? Linear probe per layer", xaxis_title="layer",
                  yaxis_title="accuracy")
fig"""),
    ("md", """**Verdict.** The hypothesis holds where the probe beats both the majority baseline and the control
task, and selectivity grows with depth. The cell below states what this run found."""),
    ("code", """best = int(np.argmax(r.selectivity))
verdict = "supported" if r.accuracy[best] > r.majority and r.selectivity[best] > 0 else "not supported"
print(f"layer {r.layers[best]}: accuracy {r.accuracy[best]:.3f} vs majority {r.majority:.3f}, "
      f"selectivity {r.selectivity[best]:.3f} -> hypothesis {verdict} on {MODEL}")"""),
]

CUSTOM = [
    ("md", """# Adding a custom analysis

An analysis is a function over arrays (it never sees a model); a study wraps it in the study contract
(`studies.contract`): the names its result holds, what it reads from a store, `compute` and `figures`.
The runner does the rest (load, capture, check, write). Here: **update alignment** — the mean cosine
between a token's state and the update the next block adds to it (negative: blocks partly erase what
they receive). The same study, as a file, is the worked example of `docs/adding_a_study.md`."""),
    ("code", """import numpy as np
import torch


def update_alignment(h: torch.Tensor, h_next: torch.Tensor) -> np.ndarray:
    \"\"\"Per token (axis ``token``): cosine between h_l and the update h_{l+1} - h_l.\"\"\"
    return torch.nn.functional.cosine_similarity(h, h_next - h, dim=-1).cpu().numpy()

# a known answer first: an update parallel to the state has cosine 1
h = torch.randn(5, 8)
assert np.allclose(update_alignment(h, 3 * h), 1.0, atol=1e-6)"""),
    ("code", """from dataclasses import dataclass

from studies.config import StudyConfig
from studies.contract import Names, Needs, ResultSpec, Study, StudyResult, array, metric, scalar

M = Names(metric("alignment", "mean over tokens of cosine(h_l, h_{l+1} - h_l)"))
S = Names(scalar("min_alignment", "the lowest alignment over transitions"))
A = Names(array("token_alignment", "layer token", "cosine per token"), array("token_index", "token", "store rows"))


@dataclass(frozen=True)
class Config(StudyConfig):
    drop_special: bool = True


def compute(config, inputs):
    store = inputs.store
    mask = store.mask(config.drop_special)
    states = list(store.view("resid_post").astype(torch.float32).take(mask))
    per_token = np.stack([update_alignment(a, b) for a, b in zip(states[:-1], states[1:])])  # (layer, token)
    mean = per_token.mean(axis=1)
    return StudyResult(model=store.model_id, corpus=inputs.corpus, n_tokens=int(mask.sum()),
                       layers=store.layers("resid_post")[:-1], metrics={M.alignment: mean},
                       summary={S.min_alignment: float(mean.min())},
                       arrays={A.token_alignment: per_token, A.token_index: np.flatnonzero(mask)})


def figures(result, config):
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=result.layers, y=result.metrics[M.alignment], mode="lines+markers"))
    fig.update_layout(title="Update alignment per layer", xaxis_title="layer l", yaxis_title="mean cosine(h, Δh)")
    return {"main": fig}


STUDY = Study(name="update-alignment", config=Config, needs=lambda config: Needs(sites=("resid_post",)),
              compute=compute, figures=figures,
              result=ResultSpec(metrics=M, summary=S, arrays=A, token_rows=A.token_index))"""),
    ("code", """import tempfile
from pathlib import Path

from studies.results import read_result
from studies.runner import run_study

runs = Path(tempfile.mkdtemp())
out = run_study(STUDY, Config(model="tiny-llama", max_tokens=400, progress=False), runs / "demo" / "update-alignment")
rec = read_result(out)
rec.summary, rec.metric(M.alignment).round(3)"""),
    ("md", """It follows the results contract, so the report includes its figure, and the explorer shows it on
the Studies and Compare pages:"""),
    ("code", """from studies.report import build_report
from studies.results import find_results

print([r.study for r in find_results(runs)])
report = build_report(runs)
print(report, report.stat().st_size // 1024, "KiB; figure embedded:", "update-alignment/main" in report.read_text())"""),
    ("md", """To make it a first-class study, put these cells in `studies/update_alignment.py` and add one line to
`STUDIES` in `studies/registry.py` (`docs/adding_a_study.md`): then `lens study update-alignment ...` and
`lens study all` run it, and its headlines and per-token arrays (Token view) appear too."""),
]


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


NOTEBOOKS = {"quickstart.ipynb": QUICKSTART, "probing_hypothesis.ipynb": PROBING, "custom_analysis.ipynb": CUSTOM}

if __name__ == "__main__":
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
