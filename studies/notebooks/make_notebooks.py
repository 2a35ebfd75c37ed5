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

layers = store.layers("resid_post")
scores = [linearity_score(store.get(layer=l).float(), store.get(layer=l + 1).float(), ridge=1e-2)
          for l in layers[:-1]]
np.round(scores, 3)"""),
    ("code", """fig = go.Figure(go.Scatter(x=layers[:-1], y=scores, mode="lines+markers"))
fig.update_layout(title=f"Linearity of layer l → l+1 — {MODEL}", xaxis_title="layer l", yaxis_title="score")
fig"""),
    ("md", "Save it as a results folder: `lens app --results <folder>` shows it, `lens report <folder>` puts it in a report."),
    ("code", """import tempfile
from studies.results import write_result, read_result

out = write_result(tempfile.mkdtemp() + "/quickstart", study="linearity", model=MODEL, corpus="wiki-sample",
                   n_tokens=store.n_tokens, layers=layers[:-1], metrics={"linearity": scores},
                   summary={"linearity_mean": float(np.mean(scores))}, figures={"main": fig})
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
from lens.token_classes import token_classes
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
    ("code", """X = [store.get(layer=l).float()[np.nonzero(keep)[0]] for l in store.layers("resid_post")]
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

An analysis is a function over arrays (it never sees a model); a study is a thin adapter that reads a
store, calls it per layer and writes a results folder. Here: **update alignment** — the mean cosine
between a token's state and the update the next block adds to it (negative: blocks partly erase what
they receive)."""),
    ("code", """import numpy as np
import torch


def update_alignment(h: torch.Tensor, h_next: torch.Tensor) -> np.ndarray:
    \"\"\"Per token (axis ``token``): cosine between h_l and the update h_{l+1} - h_l.\"\"\"
    delta = h_next - h
    cos = torch.nn.functional.cosine_similarity(h, delta, dim=-1)
    return cos.numpy()

# a known answer first: an update parallel to the state has cosine 1
h = torch.randn(5, 8)
assert np.allclose(update_alignment(h, 3 * h), 1.0, atol=1e-6)"""),
    ("code", """import tempfile
from pathlib import Path

import lens
import plotly.graph_objects as go
from studies.results import write_result

MODEL = "tiny-llama"
store = lens.capture(lens.load_model(MODEL), corpus="wiki-sample", sites=["resid_post"], max_tokens=400,
                     progress=False)
layers = store.layers("resid_post")
per_token = np.stack([update_alignment(store.get(layer=l).float(), store.get(layer=l + 1).float())
                      for l in layers[:-1]])                # (layer, token)
mean = per_token.mean(axis=1)
fig = go.Figure(go.Scatter(x=layers[:-1], y=mean, mode="lines+markers"))
fig.update_layout(title="Update alignment per layer", xaxis_title="layer l", yaxis_title="mean cosine(h, Δh)")

runs = Path(tempfile.mkdtemp())
out = write_result(runs / "demo" / "update-alignment", study="update-alignment", model=MODEL, corpus="wiki-sample",
                   n_tokens=store.n_tokens, layers=layers[:-1], metrics={"update_alignment": mean},
                   summary={"min_alignment": float(mean.min())},
                   arrays={"token_index": np.arange(store.n_tokens), "token": store.tokens["token"].astype(str),
                           "update_alignment": per_token},
                   figures={"main": fig})
out"""),
    ("md", """Because it follows the results contract, the explorer shows it (generically on Compare, and on the
Token view because of the per-token `(layer, token)` array with `token_index`) and the report includes its figure:"""),
    ("code", """from studies.report import build_report
from studies.results import find_results

print([r.study for r in find_results(runs)])
report = build_report(runs)
print(report, report.stat().st_size // 1024, "KiB; figure embedded:", "update-alignment/main" in report.read_text())"""),
    ("md", """To make it a first-class study, put `Config` (a frozen dataclass extending `studies.common.StudyConfig`)
and `run(config, out_dir)` in `studies/update_alignment.py` and register it in `studies/registry.py`;
then `lens study update-alignment ...` and `lens study all` run it."""),
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
