"""A strip of clickable tokens coloured by a value, with an instant hover card (the token, its context
and the value at this layer), as CircuitsVis-style token viewers draw them.

One ``st.components.v2`` component (inline HTML/CSS/JS, no build, nothing fetched): the hover is pure
CSS (``:hover``), not a delayed ``title``; a click sends the token's ``data-pos`` back to Python as the
trigger value ``clicked``. Every string shown is HTML-escaped here, in Python.
"""

from __future__ import annotations

import html

import numpy as np
import streamlit as st

CSS = """
.lens-tokens { line-height: 2.0; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px;
               white-space: pre-wrap; word-break: break-word; padding-bottom: 7em; }
.tok { position: relative; padding: 1px 0; border-radius: 2px; cursor: pointer; }
.tok:hover { outline: 1px solid #333; }
.tok.picked { outline: 2px solid #1f6feb; }
.tok .card { visibility: hidden; position: absolute; left: 0; top: 1.8em; z-index: 10; min-width: 16em; max-width: 34em;
             background: #fff; color: #222; border: 1px solid #bbb; border-radius: 4px; padding: 4px 8px;
             box-shadow: 0 2px 8px rgba(0,0,0,.18); white-space: normal; line-height: 1.4; font-size: 12px;
             pointer-events: none; }
.tok:hover .card { visibility: visible; }
.card b { font-size: 13px; }
.card .ctx { color: #555; font-family: ui-monospace, monospace; white-space: pre-wrap; }
.card mark { background: #f5c542; padding: 0 1px; }
.card .val { font-weight: 600; }
"""

JS = """
export default function(component) {
  const { data, setTriggerValue, parentElement } = component;
  let box = parentElement.querySelector('.lens-tokens');
  if (!box) {
    box = document.createElement('div');
    box.className = 'lens-tokens';
    box.setAttribute('data-testid', 'lens-tokens');
    parentElement.appendChild(box);
  }
  box.innerHTML = data || '';
  box.onclick = (e) => {
    const t = e.target.closest('.tok');
    if (t) setTriggerValue('clicked', Number(t.dataset.pos));
  };
}
"""

_COMPONENT = None


def _component():
    global _COMPONENT
    if _COMPONENT is None:
        _COMPONENT = st.components.v2.component("lens_token_strip", css=CSS, js=JS)
    return _COMPONENT


def visible(text: str) -> str:
    """A token as text a reader can see: newlines and tabs as symbols."""
    return str(text).replace("\n", "⏎").replace("\t", "⇥")


def strip_html(texts, shown, values, *, lo: float, hi: float, picked=None, rows=None, context: int = 6,
               value_name: str = "value", layer=None, order=None, corpus=None) -> str:
    """The tokens ``shown`` (positions into ``texts`` / ``values``), red by ``values`` between ``lo``
    and ``hi``; each with a hover card: the token, its store row (``rows``), its value (``value_name``
    at ``layer``) and ``context`` tokens each side — from ``corpus`` (the store's token table: ``token``
    and ``window`` columns, by row) when given, the token's own window; else its neighbours among the
    result's tokens (``order``: positions in corpus order)."""
    shown = np.asarray(shown)
    order = np.asarray(order if order is not None else shown)
    where = {int(p): i for i, p in enumerate(order)}
    scale = (hi - lo) or 1.0
    out = []
    for p in shown.tolist():
        v = float(values[p])
        a = 0.0 if not np.isfinite(v) else float(np.clip((v - lo) / scale, 0, 1))
        text = str(texts[p])
        i = where.get(p)
        if corpus is not None and rows is not None and 0 <= int(rows[p]) < len(corpus["token"]):
            r, win = int(rows[p]), corpus["window"]
            lo_r = r - next((k for k in range(1, context + 1) if r - k < 0 or win[r - k] != win[r]), context + 1) + 1
            hi_r = r + next((k for k in range(1, context + 1) if r + k >= len(win) or win[r + k] != win[r]),
                            context + 1)
            before = "".join(str(t) for t in corpus["token"][lo_r:r])
            after = "".join(str(t) for t in corpus["token"][r + 1:hi_r])
        elif i is None:
            before = after = ""
        else:
            before = "".join(str(texts[q]) for q in order[max(0, i - context):i])
            after = "".join(str(texts[q]) for q in order[i + 1:i + 1 + context])
        row = "" if rows is None else f" · row {int(rows[p])}"
        at = "" if layer is None else f" at layer {layer}"
        card = (f"<span class='card'><b>{html.escape(repr(text))}</b>{html.escape(row)}<br>"
                f"<span class='val'>{html.escape(value_name)}{html.escape(at)} = {v:.4g}</span><br>"
                f"<span class='ctx'>…{html.escape(visible(before))}<mark>{html.escape(visible(text))}</mark>"
                f"{html.escape(visible(after))}…</span></span>")
        cls = "tok picked" if picked is not None and p == picked else "tok"
        out.append(f"<span class='{cls}' data-pos='{p}' style='background:rgba(220,50,32,{a:.2f})'>"
                   f"{html.escape(text)}{card}</span>")
    return "".join(out)


def clicked_in_state(key: str):
    """The position a click on the strip ``key`` sent, read from session state (in a callback, before
    the script reruns), or None."""
    state = st.session_state.get(key)
    if state is None:
        return None
    value = state.get("clicked") if hasattr(state, "get") else getattr(state, "clicked", None)
    return None if value is None else int(value)


def token_strip(markup: str, key: str, on_click=None):
    """Draw the strip; the position clicked in this rerun, or None. ``on_click`` runs before the rerun
    a click causes (:func:`clicked_in_state` reads the position there), so the page draws the pick at once."""
    result = _component()(data=markup, key=key, on_clicked_change=on_click or (lambda: None))
    clicked = getattr(result, "clicked", None)
    return None if clicked is None else int(clicked)
