"""lens.store.contexts: a token's context stays inside the window the model saw."""

from __future__ import annotations

import numpy as np
import pytest

from lens.errors import LensInputError
from lens.store.contexts import token_contexts


def table():
    """Windows numbered per document: doc 0's window 0 is followed by doc 1's window 0, so a window is
    bounded by its (doc, window) pair, not its window number."""
    doc = np.array([0] * 5 + [1] * 4 + [1] * 3 + [2] * 2)
    win = np.array([0] * 5 + [0] * 4 + [1] * 3 + [0] * 2)
    pos = np.concatenate([np.arange(5), np.arange(4), np.arange(3), np.arange(2)])
    text = np.array(["<s>", "A", " cat", " sat", ".", "<s>", "B", " dog", " ran", " far", " and", " fast", "<s>", "!"])
    return {"doc": doc, "window": win, "pos": pos, "token": text, "token_id": np.arange(14)}


def test_context_is_cut_at_the_window_edges():
    tok = table()
    c = token_contexts(tok, 2, width=1)[0]
    assert c.rows.tolist() == [1, 2, 3] and c.at == 1 and c.marked() == "A⟦ cat⟧ sat"
    assert (c.doc, c.window, c.pos, c.token, c.before, c.after) == (0, 0, 2, " cat", "A", " sat")
    c = token_contexts(tok, 4, width=3)[0]  # last of doc 0's window 0: doc 1's window 0 follows, not shown
    assert c.rows.tolist() == [1, 2, 3, 4] and c.after == "" and c.marked("[", "]") == "A cat sat[.]"
    c = token_contexts(tok, 5, width=3)[0]  # first of its window: nothing before it
    assert c.rows.tolist() == [5, 6, 7, 8] and c.before == ""
    c = token_contexts(tok, 9, width=10)[0]  # doc 1's window 1 starts after its window 0
    assert c.rows.tolist() == [9, 10, 11] and c.texts == (" far", " and", " fast")
    assert token_contexts(tok, 13, width=0)[0].marked() == "⟦!⟧"


def test_several_rows_in_order():
    ctxs = token_contexts(table(), np.array([12, 0, 12]), width=2)
    assert [c.row for c in ctxs] == [12, 0, 12] and ctxs[1].rows.tolist() == [0, 1, 2]
    assert token_contexts(table(), [], width=2) == []


def test_bad_input():
    with pytest.raises(LensInputError, match=r"rows must be 0..13 .* got \[14\]"):
        token_contexts(table(), [3, 14])
    with pytest.raises(LensInputError, match="width must be"):
        token_contexts(table(), 3, width=-1)
    with pytest.raises(LensInputError, match="lacks window"):
        token_contexts({k: v for k, v in table().items() if k != "window"}, 3)
    with pytest.raises(LensInputError, match="store row indices"):
        token_contexts(table(), [1.5])
