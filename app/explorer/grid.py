"""The token × layer grid of a logit-lens result, built from its saved arrays alone (no model, no store).

One cell per (layer, position in a window): its text is the lens' top-1 token, its colour one per-token
measure of that lens (cross-entropy, entropy, KL to the final layer or rank of the true next token), its
hover the top-k with probabilities; a click opens that token at that layer in the Token view
(:func:`app.explorer.links.token_view_url`). The arrays are those :mod:`studies.logit_lens.study` saves
(``grid_topk`` / ``grid_topk_probs`` over ``grid_vocab``; results written before the grid existed fall
back to ``token_top1_str`` and the first ``topk_rows`` tokens' ``topk_str`` / ``topk_probs``).
Nothing here imports streamlit or torch: ``tests/app/explorer/test_grid.py`` builds grids from synthetic runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from studies.logit_lens.declaration import A, RESULT


@dataclass(frozen=True)
class Lens:
    """One decoding of the grid: its top-k arrays and the per-token arrays it can be coloured by."""

    name: str
    title: str
    top: str
    probs: str
    colours: dict  # colour key -> per-token array name (layer, token)
    top1: str | None = None  # (layer, token) top-1 text, when the top-k arrays are missing


LENSES = {
    "logit": Lens("logit", "logit lens (resid_post)", A.grid_topk, A.grid_topk_probs,
                  {"ce": A.token_ce, "entropy": A.token_entropy, "kl": A.token_kl, "rank": A.token_rank},
                  top1=A.token_top1_str),
    "resid_mid": Lens("resid_mid", "logit lens of resid_mid (after attention, before the MLP)", A.mid_grid_topk,
                      A.mid_grid_topk_probs, {"ce": A.mid_token_ce, "entropy": A.mid_token_entropy,
                                              "kl": A.mid_token_kl, "rank": A.mid_token_rank}),
    "jacobian": Lens("jacobian", "Jacobian lens (J_l before the model's head; Gurnee et al. 2026)",
                     A.jacobian_grid_topk, A.jacobian_grid_topk_probs,
                     {"ce": A.jacobian_token_ce, "entropy": A.jacobian_token_entropy, "kl": A.jacobian_token_kl,
                      "rank": A.jacobian_token_rank}),
}
COLOURS = ("ce", "entropy", "kl", "rank")
# low (good: confident, close to the final layer) -> high, Viridis reversed as the study's own heatmap
_SCALE = ((0.0, (253, 231, 37)), (0.25, (94, 201, 98)), (0.5, (33, 145, 140)), (0.75, (59, 82, 139)),
          (1.0, (68, 1, 84)))


@dataclass(frozen=True)
class Grid:
    """``values`` / ``top1`` / ``hover``: (layer, position); ``tokens`` (position,) indexes the result's
    ``token`` axis, ``rows`` the store rows, ``texts`` the input tokens; ``colour_title`` names the
    colour with its unit (``log10`` for rank)."""

    lens: str
    colour: str
    colour_array: str
    colour_title: str
    layers: list
    tokens: np.ndarray
    rows: np.ndarray
    texts: np.ndarray
    positions: np.ndarray
    values: np.ndarray
    shade: np.ndarray  # (layer, position) in [0, 1], NaN where the value is missing
    top1: np.ndarray
    topk: np.ndarray  # (layer, position, k) the lens' top-k texts ("" past the first: not saved)
    probs_k: np.ndarray | None  # (layer, position, k) their probabilities in thousandths (NaN: unknown)
    shown: np.ndarray  # (layer, position) the colour's value as the hover shows it
    value_label: str
    unit: str
    low: float
    high: float

    def header(self, i: int, p: int) -> str:
        return f"layer {self.layers[i]} · position {int(self.positions[p])} · input {str(self.texts[p])!r}"

    @cached_property
    def hover(self) -> np.ndarray:
        """(layer, position) the hover text of each cell: where it is, the colour's value, the top-k with
        probabilities (the page builds the same text from the same parts, see ``_JS``)."""
        out = np.empty(self.values.shape, dtype=object)
        for i in range(out.shape[0]):
            for p in range(out.shape[1]):
                tops = []
                for k in range(self.topk.shape[2]):
                    t = str(self.topk[i, p, k])
                    if t == "" and k:
                        continue
                    pr = None if self.probs_k is None else self.probs_k[i, p, k]
                    tops.append(f"{t!r} {pr / 1000:.3f}" if pr is not None and math.isfinite(pr) else f"{t!r}")
                out[i, p] = (f"{self.header(i, p)}\n{self.value_label}: {self.shown[i, p]} {self.unit}\n"
                             + "\n".join(tops))
        return out.astype(str)


def grid_size(arrays: dict) -> int:
    """How many tokens of the ``token`` axis (from the first) have a top-k saved for the grid."""
    if A.grid_topk in arrays:
        return int(arrays[A.grid_topk].shape[1])
    if A.token_top1_str in arrays:
        return int(arrays[A.token_top1_str].shape[1])
    return 0


def lenses(arrays: dict) -> list[str]:
    """The lenses of ``LENSES`` this result saved (the logit lens also from its top-1 texts alone)."""
    out = []
    for name, lens in LENSES.items():
        has_top = lens.top in arrays or (lens.top1 is not None and lens.top1 in arrays)
        if has_top and any(a in arrays for a in lens.colours.values()) and A.token_index in arrays:
            out.append(name)
    return out


def colours(arrays: dict, lens: str) -> list[str]:
    """The colour keys the lens can use here (those whose per-token array was saved)."""
    return [c for c in COLOURS if LENSES[lens].colours[c] in arrays]


def colour_title(lens: str, colour: str) -> str:
    """The colour's human label and unit, from the declaration (rank: drawn as log10(rank + 1))."""
    name = LENSES[lens].colours[colour]
    label = RESULT.label(name)
    return f"{RESULT.label(name, unit=False)} (log10 of rank + 1)" if colour == "rank" else label


def windows(arrays: dict) -> list[dict]:
    """The windows the grid covers, in result order: {window, doc, start, stop} (a ``token`` axis slice,
    the window's tokens that have a top-k saved)."""
    n = grid_size(arrays)
    if not n or A.window not in arrays:
        return []
    win = np.asarray(arrays[A.window])[:n]
    doc = np.asarray(arrays[A.doc])[:n] if A.doc in arrays else np.full(n, -1)
    cuts = np.flatnonzero(np.diff(win) != 0) + 1
    starts, stops = np.r_[0, cuts], np.r_[cuts, n]
    return [{"window": int(win[a]), "doc": int(doc[a]), "start": int(a), "stop": int(b)}
            for a, b in zip(starts, stops)]


def _topk(arrays: dict, lens: Lens, cols: np.ndarray):
    """(texts, probs) (layer, position, k) for the token-axis indices ``cols``; probs None when unknown."""
    if lens.top in arrays and A.grid_vocab in arrays:
        vocab = np.asarray(arrays[A.grid_vocab]).astype(str)
        idx = np.asarray(arrays[lens.top])[:, cols].astype(np.int64)
        return vocab[idx], np.asarray(arrays[lens.probs])[:, cols].astype(np.float32)
    top1 = np.asarray(arrays[lens.top1])[:, cols].astype(str)[:, :, None]
    if lens.name == "logit" and {A.topk_rows, A.topk_str, A.topk_probs} <= set(arrays):
        # an older result: the first topk_rows tokens kept their top-k
        rows = np.asarray(arrays[A.token_index])[cols]
        slot = {int(r): i for i, r in enumerate(np.asarray(arrays[A.topk_rows]))}
        k = arrays[A.topk_str].shape[2]
        texts = np.full(top1.shape[:2] + (k,), "", dtype=object)
        probs = np.full(top1.shape[:2] + (k,), np.nan, np.float32)
        texts[:, :, 0] = top1[:, :, 0]
        for p, r in enumerate(rows):
            if int(r) in slot:
                texts[:, p] = np.asarray(arrays[A.topk_str])[:, slot[int(r)]].astype(str)
                probs[:, p] = arrays[A.topk_probs][:, slot[int(r)]]
        return texts.astype(str), probs
    return top1, None


def build_grid(arrays: dict, layers, *, lens: str = "logit", colour: str = "ce", start: int = 0,
               stop: int | None = None) -> Grid:
    """The grid over the ``token`` axis slice ``start:stop`` (one window, or part of one)."""
    if lens not in LENSES:
        raise ValueError(f"unknown lens {lens!r}: expected one of {', '.join(LENSES)}")
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}: expected one of {', '.join(COLOURS)}")
    spec = LENSES[lens]
    name = spec.colours[colour]
    if name not in arrays:
        raise ValueError(f"this result saved no {name!r}: colour by one of {', '.join(colours(arrays, lens))}")
    n = grid_size(arrays)
    stop = n if stop is None else min(int(stop), n)
    cols = np.arange(max(0, int(start)), stop)
    values = np.asarray(arrays[name])[:, cols].astype(np.float64)
    if colour == "rank":
        values = np.where(values < 0, np.nan, values)  # -1: next token unknown
    scaled = np.log10(values + 1) if colour == "rank" else values
    finite = scaled[np.isfinite(scaled)]
    low, high = (np.percentile(finite, [2, 98]) if finite.size else (0.0, 1.0))
    shade = np.clip((scaled - low) / ((high - low) or 1.0), 0, 1)
    texts, probs = _topk(arrays, spec, cols)
    inputs = np.asarray(arrays[A.token])[cols].astype(str) if A.token in arrays else np.array([""] * cols.size)
    pos = np.asarray(arrays[A.pos])[cols] if A.pos in arrays else cols - cols[:1]
    shown = np.array([["—" if not math.isfinite(v) else (f"{int(v)}" if colour == "rank" else f"{v:.3g}")
                        for v in row] for row in values], dtype=object).reshape(values.shape).astype(str)
    probs_k = None if probs is None else np.rint(probs.astype(np.float64) * 1000)
    return Grid(lens=lens, colour=colour, colour_array=name, colour_title=colour_title(lens, colour),
                layers=[int(l) for l in layers],
                tokens=cols, rows=np.asarray(arrays[A.token_index])[cols].astype(np.int64), texts=inputs,
                positions=np.asarray(pos), values=values, shade=shade, top1=texts[:, :, 0], topk=texts,
                probs_k=probs_k, shown=shown, value_label=RESULT.label(name, unit=False), unit=RESULT.unit(name),
                low=float(10 ** low - 1) if colour == "rank" else float(low),
                high=float(10 ** high - 1) if colour == "rank" else float(high))


def _rgb(t: float) -> tuple[int, int, int]:
    for (a, ca), (b, cb) in zip(_SCALE, _SCALE[1:]):
        if t <= b:
            w = (t - a) / (b - a)
            return tuple(int(round(x + w * (y - x))) for x, y in zip(ca, cb))
    return _SCALE[-1][1]


_CSS = """<style>
.lens-grid{border-collapse:collapse;font-family:ui-monospace,monospace;font-size:12px}
.lens-grid th{font-weight:normal;padding:1px 4px;color:#555;white-space:pre}
.lens-grid th.tok{writing-mode:vertical-rl;transform:rotate(180deg);max-height:90px;overflow:hidden}
.lens-grid td{padding:0;border:1px solid #fff}
.lens-grid td a{display:block;min-width:34px;padding:2px 3px;text-decoration:none;white-space:pre}
.lens-grid td .tip{display:none;position:absolute;z-index:10;background:#222;color:#fff;
 padding:4px 6px;border-radius:3px;white-space:pre;font-size:12px;pointer-events:none}
.lens-grid td:hover a{outline:2px solid #d62728}
.lens-grid td:hover .tip{display:block}
.lens-grid-wrap{overflow:auto;max-height:900px;position:relative}
.lens-grid-colours{font-size:14px;margin:0 0 6px 0}
.lens-grid-colours label{margin-right:14px;cursor:pointer}
.lens-grid-colours input{accent-color:#ff4b4b;vertical-align:-2px}
.lens-grid-legend{display:block;color:#555;font-size:13px;margin-top:2px}
</style>"""


CELL_CHARS = 9  # characters of a cell's token drawn (a longer one ends in "…"; its hover shows it whole)

# The page builds the table from a compact payload (a cell's text, shade and link; its hover made on the
# first hover from the same parts as ``Grid.hover``): a 40-position grid of 30 layers is ~60 kB of JSON
# instead of ~480 kB of HTML that the browser had to sanitise and parse on every switch. Every colour the
# result saved travels with it, so switching the colour repaints the cells in the page (no rerun). No "<"
# followed by a word character, "/" or "!" may appear here: Streamlit's sanitiser drops a script with one.
_JS = """(function () {
  const me = document.currentScript, d = JSON.parse(me.previousElementSibling.textContent);
  const wrap = me.previousElementSibling.previousElementSibling;
  const P = d.pos.length, K = d.k, L = d.layers.length;
  const el = (tag, cls, text) => {
    const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text;
    return e;
  };
  // a cell's text: a token of spaces alone drawn as "␣", newlines and tabs escaped, the empty one blank, a
  // long one cut to d.cell_chars characters ending in "…" (its hover says it whole)
  const cut = (t) => ([...t].length > d.cell_chars ? [...t].slice(0, d.cell_chars - 1).join("") + "…" : t);
  const shown = (t) => cut((t.trim() === "" ? t.split(" ").join("␣") : t).split("\\n").join("\\\\n")
    .split("\\t").join("\\\\t")) || "\\u00a0";
  const bar = el("div", "lens-grid-colours"), legend = el("span", "lens-grid-legend");
  bar.setAttribute("role", "radiogroup"); bar.setAttribute("aria-label", "colour");
  bar.appendChild(el("span", "", "colour: "));
  // the table is one HTML string parsed once (2480 created nodes and 3720 dataset writes cost ~0.1 s a grid);
  // LT is "<" (a literal one followed by a letter would end this script for Streamlit's sanitiser)
  const LT = String.fromCharCode(60), esc = (t) => String(t).split("&").join("&amp;").split(LT).join("&lt;")
    .split(">").join("&gt;").split('"').join("&quot;");
  const html = [LT + 'tbody>' + LT + 'tr>' + LT + 'th>' + LT + '/th>'];
  for (let p = 0; p !== P; p++) {
    html.push(LT + 'th class="tok" title="' + esc(d.input_repr[p]) + '">' + esc(d.input_repr[p].slice(1, -1)) +
              LT + '/th>');
  }
  html.push(LT + '/tr>');
  for (let i = L - 1; i >= 0; i--) {
    html.push(LT + 'tr>' + LT + 'th>' + esc(d.layers[i]) + LT + '/th>');
    for (let p = 0; p !== P; p++) {
      const c = i * P + p;
      html.push(LT + 'td>' + LT + 'a target="_self" data-layer="' + d.layers[i] + '" data-row="' + d.rows[p] +
                '" data-cell="' + c + '">' + esc(shown(d.vocab[d.top[c * K]])) + LT + '/a>' + LT + '/td>');
    }
    html.push(LT + '/tr>');
  }
  html.push(LT + '/tbody>');
  const table = el("table", "lens-grid"); table.dataset.testid = "lens-grid";
  table.innerHTML = html.join("");
  const cells = [...table.querySelectorAll("a")];
  // each cell's layer, row and index, read once (paint and hover use them)
  const meta = cells.map((a) => [a.dataset.layer, a.dataset.row, +a.dataset.cell]);
  let cur = d.colours[0];
  const paint = (col) => {
    cur = col;
    cells.forEach((a, j) => {
      const [layer, row, c] = meta[j], s = col.shade[c], rgb = s >= 0 ? d.palette[s] : ["#eee", "#555"];
      a.style.background = rgb[0]; a.style.color = rgb[1];
      a.href = col.href.replace("{layer}", layer).replace("{row}", row);
    });
    table.querySelectorAll(".tip").forEach((t) => t.remove());
    legend.textContent = col.title + ": light = " + col.low + ", dark = " + col.high +
      " (2nd–98th percentile)";
    table.dataset.colour = col.key;
  };
  const group = "lens-grid-colour-" + Math.random().toString(36).slice(2);
  d.colours.forEach((col, j) => {
    const lab = el("label"), input = el("input");
    input.type = "radio"; input.name = group; input.value = col.key;
    input.checked = j === 0; input.addEventListener("change", () => paint(col));
    lab.appendChild(input); lab.appendChild(document.createTextNode(" " + col.title)); bar.appendChild(lab);
  });
  bar.appendChild(legend);
  table.addEventListener("mouseover", (ev) => {
    const td = ev.target.closest("td");
    if (!td || td.querySelector(".tip")) return;
    const c = +td.firstChild.dataset.cell, i = Math.floor(c / P), p = c % P, lines = [
      "layer " + d.layers[i] + " · position " + d.pos[p] + " · input " + d.input_repr[p],
      cur.label + ": " + cur.shown[c] + " " + cur.unit];
    for (let k = 0; k !== K; k++) {
      const v = d.top[c * K + k], pr = d.probs ? d.probs[c * K + k] : null;
      if (k && d.vocab[v] === "") continue;
      lines.push(d.vocab_repr[v] + (pr === null ? "" : " " + (pr / 1000).toFixed(3)));
    }
    td.appendChild(el("span", "tip", lines.join("\\n")));
  });
  paint(cur);
  wrap.appendChild(bar); wrap.appendChild(table);
})();"""


def grid_payload(grids, href) -> dict:
    """What the page needs to draw the grids (one per colour, the first shown; see ``_JS``): texts once
    each (``vocab``), cells as indices; ``href(layer, store_row, colour_array)`` a cell's link."""
    grids = list(grids)
    first = grids[0]
    if any(g.lens != first.lens or not np.array_equal(g.tokens, first.tokens) for g in grids):
        raise ValueError("the grids of one payload must be one lens over the same tokens, in other colours")
    k = first.topk.shape[2]
    vocab, top = np.unique(first.topk.astype(str), return_inverse=True)
    probs = None
    if first.probs_k is not None:
        probs = [None if not math.isfinite(v) else int(v) for v in first.probs_k.ravel()]
    return {"layers": first.layers, "pos": [int(x) for x in first.positions], "rows": [int(x) for x in first.rows],
            "input_repr": [repr(str(t)) for t in first.texts], "k": int(k),
            "vocab": [str(v) for v in vocab], "vocab_repr": [repr(str(v)) for v in vocab],
            "top": top.ravel().tolist(), "probs": probs, "cell_chars": CELL_CHARS, "palette": [_colours(t / 100) for t in range(101)],
            "colours": [_colour_payload(g, href) for g in grids]}


def _colour_payload(g: Grid, href) -> dict:
    shade = np.where(np.isfinite(g.shade), np.rint(np.nan_to_num(g.shade) * 100), -1).astype(int)
    layer_mark, row_mark = -987_654_321, -987_654_322  # "{layer}" / "{row}" in the link (an encoded URL has no braces)
    template = href(layer_mark, row_mark, g.colour_array)
    if template.count(str(layer_mark)) != 1 or template.count(str(row_mark)) != 1:
        raise ValueError(f"href(layer, row, array) must put each of layer and row once in the link, got {template!r}")
    return {"key": g.colour, "title": g.colour_title, "label": g.value_label, "unit": g.unit,
            "low": f"{g.low:.3g}", "high": f"{g.high:.3g}", "shade": shade.ravel().tolist(),
            "shown": g.shown.ravel().tolist(),
            "href": template.replace(str(layer_mark), "{layer}").replace(str(row_mark), "{row}")}


def _colours(t: float) -> list[str]:
    r, g, b = _rgb(t)
    return [f"rgb({r},{g},{b})", "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"]


def grid_html(grids, href) -> str:
    """The grid for ``st.html(..., unsafe_allow_javascript=True)``: rows = layers (last on top, as the
    study's heatmap), columns = positions; each cell a link ``href(layer, store_row, colour_array)`` with
    an instant hover (the top-k); a colour switch above it (``grids``: one per colour, the first shown)
    that repaints in the page. Drawn from :func:`grid_payload` (no "<" in the JSON)."""
    data = json.dumps(grid_payload(grids, href), ensure_ascii=False, separators=(",", ":"))
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (f"{_CSS}<div class=lens-grid-wrap></div><script type=application/json>{data}</script>"
            f"<script>{_JS}</script>")
