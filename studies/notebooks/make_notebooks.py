"""Write the notebooks from the cells below, run them and keep their outputs.

    .venv/bin/python studies/notebooks/make_notebooks.py            # write, run offline (nbclient), save outputs
    .venv/bin/python studies/notebooks/make_notebooks.py --no-run   # write the cells only, without outputs

Keeping the source here makes review and diffs easy. The .ipynb files are committed with their outputs, so a
static viewer (GitHub) shows them: each plotly figure keeps its interactive form (JupyterLab, VS Code) and gains
a PNG of itself, drawn by plotly.js in headless Chromium (the browser the explorer's tests use), which a viewer
that runs no JavaScript shows instead. tests/studies/reporting/test_notebooks.py executes them top to bottom and checks
the committed outputs.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
import plotly.offline

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLOTLY = "application/vnd.plotly.v1+json"  # the figure itself; an HTML form of it needs JavaScript, so none is kept
CHROMIUM = "/usr/bin/chromium"  # scripts/system_deps.sh installs it
# the kernel's environment: offline (packaged models only), plotly's figures as data, no tokenizer threads warning
KERNEL_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PLOTLY_RENDERER": "plotly_mimetype"}

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
    ("md", """Save it as a results folder under the names the linearity study declares (`studies.linearity.study.M` /
`S`: the one place those names are spelled): `lens app --results <folder>` shows it on the Geometry page,
`lens report <folder>` puts it in a report. `lens study linearity` computes the full study the same way."""),
    ("code", """import tempfile
from studies.linearity.study import M, S
from studies.reporting.results import write_result, read_result

out = write_result(tempfile.mkdtemp() + "/quickstart", study="linearity", model=MODEL, corpus="wiki-sample",
                   n_tokens=store.n_tokens, layers=layers[:-1], metrics={M.linearity: scores},
                   summary={S.linearity_mean: float(np.mean(scores))}, figures={"main": fig})
read_result(out).summary"""),
    ("md", """## A real model: the logit lens of one sentence

`smollm2-135m` is packaged with the workbench (no download). Capture one sentence, decode every layer's
residual stream through the model's own final norm and unembedding (`lens.readout.logit_lens`), and read the
top-1 next token at each layer and position — the view the tuned-lens and nnsight tutorials open with.
The last row is the model's own prediction."""),
    ("code", """from lens.readout.logit_lens import logit_lens
from lens.text.corpora import token_strings

real = lens.load_model("smollm2-135m")
sentence = "The Eiffel Tower is in the city of"
one = lens.capture(real, corpus=[sentence], sites=["resid_post"], progress=False)   # every layer, in memory
view = one.view("resid_post")
states = {layer: view[i] for i, layer in enumerate(view.layers)}
res = logit_lens(real, states, states[view.layers[-1]], one.tokens["next_token_id"], top_k=1,
                 topk_rows=np.arange(one.n_tokens))                                  # keep every position's top-1
top1 = token_strings(real.tokenizer, res.topk_ids[:, :, 0].ravel()).reshape(res.topk_ids.shape[:2]).tolist()
p1 = res.topk_probs[:, :, 0]
answer = top1[-1][-1]
first = next(i for i, row in enumerate(top1) if row[-1] == answer)
print(f"after {sentence!r} the model predicts {answer!r} (p = {p1[-1, -1]:.2f}); the lens first reads it at "
      f"layer {res.layers[first]} of {real.n_layers}")
words = one.tokens["token"].tolist()
fig = go.Figure(go.Heatmap(z=p1, x=list(range(len(words))), y=res.layers, text=top1, texttemplate="%{text}",
                           colorscale="Blues", zmin=0, zmax=1, colorbar=dict(title="p(top-1)"),
                           hovertemplate="layer %{y}, after %{x}: %{text} (p = %{z:.2f})<extra></extra>"))
fig.update_layout(title="Logit lens of SmolLM2-135M: the top-1 next token at each layer (colour: its probability)",
                  xaxis=dict(title="input token", tickvals=list(range(len(words))), ticktext=words),
                  yaxis_title="layer", height=120 + 22 * len(res.layers), width=900)
fig"""),
]

PROBING = [
    ("md", """# Probing a hypothesis with the probe API

**Hypothesis.** A token's state says whether the *next* token will be punctuation — and says it more
clearly in later layers, where the model prepares its prediction. A linear probe per layer tests this;
Hewitt & Liang's control task (labels assigned at random per word type) tells whether the probe reads
the representation or just memorises word identities (*selectivity* = accuracy − control accuracy).

The model is SmolLM2-135M (`smollm2-135m`, packaged with the workbench: a real trained model, no download),
on 2000 tokens of the Lee news corpus."""),
    ("code", """import lens
import numpy as np
from lens.text.token_classes import token_classes
from probes import LinearProbe

MODEL, N_TOKENS = "smollm2-135m", 2000
store = lens.capture(lens.load_model(MODEL), corpus="lee", sites=["resid_post"], max_tokens=N_TOKENS,
                     seq_len=128, progress=False)
tok = store.tokens
next_text = np.empty(store.n_tokens, dtype=object)
next_text[:-1] = tok["token"][1:]
rows = np.flatnonzero(tok["next_token_id"] >= 0)          # tokens that have a next token
punct = token_classes(next_text[rows].astype(str)) == "punctuation"
print(f"{len(rows)} tokens from {len(np.unique(tok['doc']))} documents, {punct.mean():.1%} followed by punctuation")"""),
    ("md", """About one token in eleven is followed by punctuation, so always answering "no" is already 91% right and
hides what a probe reads. The probe sees every token followed by punctuation and as many others drawn at
random: the majority baseline is then near 50%, and accuracy above it is signal. Folds are grouped by
document (a document never sits on both sides of a split)."""),
    ("code", """import torch

rng = np.random.default_rng(0)
chosen = np.sort(np.r_[rows[punct], rng.choice(rows[~punct], size=int(punct.sum()), replace=False)])
labels = (token_classes(next_text[chosen].astype(str)) == "punctuation").astype(int)
X = store.view("resid_post").astype(torch.float32).take(chosen)   # lazy: one layer read at a time
# a ridge classifier per layer, its strength chosen by exact leave-one-out error inside each training fold
probe = LinearProbe(kind="ridge", n_folds=5, seed=0).fit(X, labels, word_types=tok["token_id"][chosen],
                                                         groups=tok["doc"][chosen])
r = probe.result_
{"tokens": len(chosen), "accuracy": np.round(r.accuracy, 3), "control": np.round(r.control_accuracy, 3),
 "selectivity": np.round(r.selectivity, 3), "majority": round(r.majority, 3), "best_layer": r.best_layer}"""),
    ("code", """import plotly.graph_objects as go

fig = go.Figure([go.Scatter(x=r.layers, y=r.accuracy, name="probe"),
                 go.Scatter(x=r.layers, y=r.control_accuracy, name="control task"),
                 go.Scatter(x=r.layers, y=[r.majority] * len(r.layers), name="majority", line=dict(dash="dot"))])
fig.update_layout(title=f"Is the next token punctuation? Linear probe per layer — {MODEL}",
                  xaxis_title="layer (resid_post)", yaxis_title="held-out accuracy (balanced sample)")
fig"""),
    ("md", """**Verdict.** The hypothesis holds where the probe beats both the majority baseline and the control
task, and selectivity grows with depth (the last third of the layers against the first third). The cell
below states what this run found."""),
    ("code", """best = int(np.argmax(r.selectivity))
third = len(r.layers) // 3
early, late = float(np.mean(r.selectivity[:third])), float(np.mean(r.selectivity[-third:]))
holds = r.accuracy[best] > r.majority and r.selectivity[best] > 0 and late > early
print(f"layer {r.layers[best]}: accuracy {r.accuracy[best]:.3f} vs majority {r.majority:.3f}, selectivity "
      f"{r.selectivity[best]:.3f}; mean selectivity {early:.3f} in the first third of the layers, {late:.3f} in the "
      f"last -> hypothesis {'supported' if holds else 'not supported'} on {MODEL}")"""),
]

CUSTOM = [
    ("md", """# Adding a custom analysis

An analysis is a function over arrays (it never sees a model); a study wraps it in the study contract
(`studies.core.contract`): the names its result holds, what it reads from a store, `compute` and `figures`.
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

from studies.core.config import StudyConfig
from studies.core.contract import Names, Needs, ResultSpec, Study, StudyResult, array, metric, scalar

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

from studies.reporting.results import read_result
from studies.core.runner import run_study

runs = Path(tempfile.mkdtemp())
out = run_study(STUDY, Config(model="tiny-llama", max_tokens=400, progress=False), runs / "demo" / "update-alignment")
rec = read_result(out)
rec.summary, rec.metric(M.alignment).round(3)"""),
    ("md", """It follows the results contract, so the report includes its figure, and the explorer shows it on
the Studies and Compare pages:"""),
    ("code", """from studies.reporting.report import build_report
from studies.reporting.results import find_results

print([r.study for r in find_results(runs)])
report = build_report(runs)
print(report, report.stat().st_size // 1024, "KiB; figure embedded:", "update-alignment/main" in report.read_text())"""),
    ("md", """To make it a first-class study, put these cells in `studies/update_alignment.py` and add one line to
`STUDIES` in `studies/core/registry.py` (`docs/adding_a_study.md`): then `lens study update-alignment ...` and
`lens study all` run it, and its headlines and per-token arrays (Token view) appear too."""),
]


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells])
    for i, cell in enumerate(nb.cells):  # stable ids: a rebuilt notebook differs only where its cells do
        cell.id = f"cell-{i}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell in a fresh python3 kernel (cwd = the repository root, offline), keeping the outputs."""
    from nbclient import NotebookClient

    os.environ.update({**KERNEL_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    NotebookClient(nb, kernel_name="python3", timeout=timeout, record_timing=False,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb


def figure_outputs(nb: nbformat.NotebookNode) -> list:
    """The outputs that hold a plotly figure."""
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.output_type in ("display_data", "execute_result") and PLOTLY in o.get("data", {})]


def render_pngs(figures: list[dict], scale: float = 1.0) -> list[bytes]:
    """Each plotly figure ({data, layout}) as a PNG drawn by plotly.js (the package's own copy, offline) in
    headless Chromium: what the interactive figure shows, at its layout's size (700 x 450 when it sets none)."""
    from playwright.sync_api import sync_playwright

    page_html = f"<html><body style='margin:0'><div id='fig'></div><script>{plotly.offline.get_plotlyjs()}</script></body></html>"
    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else None)
        try:
            page = browser.new_page()
            page.route("**/*", lambda route: route.abort())  # nothing leaves the machine (fonts, map tiles)
            page.set_content(page_html)
            for fig in figures:
                layout = fig.get("layout", {})
                size = {"width": layout.get("width") or 700, "height": layout.get("height") or 450}
                url = page.evaluate("""async ([fig, size, scale]) => {
                    const div = document.getElementById('fig');
                    await Plotly.newPlot(div, fig.data, {...fig.layout, ...size}, {staticPlot: true});
                    return await Plotly.toImage(div, {format: 'png', ...size, scale: scale});
                }""", [json.loads(json.dumps(fig)), size, scale])
                out.append(base64.b64decode(url.split(",", 1)[1]))
        finally:
            browser.close()
    return out


def add_static_pngs(nb: nbformat.NotebookNode) -> int:
    """Give every plotly output a PNG of itself (``image/png``, shown where JavaScript does not run) and drop
    an HTML form (a viewer that prefers HTML would show it blank); returns how many."""
    outs = figure_outputs(nb)
    for out, png in zip(outs, render_pngs([o.data[PLOTLY] for o in outs]), strict=True):
        out.data["image/png"] = base64.b64encode(png).decode("ascii")
        out.data.pop("text/html", None)
    return len(outs)


NOTEBOOKS = {"quickstart.ipynb": QUICKSTART, "probing_hypothesis.ipynb": PROBING, "custom_analysis.ipynb": CUSTOM}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="write the notebooks (and run them, keeping their outputs)")
    parser.add_argument("--no-run", action="store_true", help="write the cells only, without outputs")
    parser.add_argument("names", nargs="*", help=f"some of {', '.join(NOTEBOOKS)} (default: all)")
    args = parser.parse_args(argv)
    for name in args.names or NOTEBOOKS:
        nb = build(NOTEBOOKS[name])
        if not args.no_run:
            t0 = time.time()
            execute(nb)
            n = add_static_pngs(nb)
            print(f"{name}: ran in {time.time() - t0:.0f} s, {n} figures with a PNG", file=sys.stderr)
        nbformat.write(nb, HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
