"""A token in its context: the tokens around a store row, within the window the model saw.

The context of row ``r`` is rows ``r − width .. r + width`` cut to ``r``'s capture window (the rows
that share its ``doc`` and ``window``, which a store keeps contiguous): the model never saw across a
window's edge, so neither does the context. Texts are the token table's decoded ``token`` column;
special tokens (BOS, CLS, SEP) are shown as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lens.errors import LensInputError

MARKS = ("⟦", "⟧")  # around the token itself in :meth:`TokenContext.marked`


@dataclass(frozen=True)
class TokenContext:
    """Store row ``row`` and its context.

    rows : (token,) int64, the context's store rows in order (``row`` among them).
    texts : the token text of each of ``rows``.
    at : where ``row`` sits in ``rows``.
    doc, window, pos : the row's document, capture window and position in that window.
    """

    row: int
    rows: np.ndarray
    texts: tuple[str, ...]
    at: int
    doc: int
    window: int
    pos: int

    @property
    def token(self) -> str:
        return self.texts[self.at]

    @property
    def before(self) -> str:
        return "".join(self.texts[: self.at])

    @property
    def after(self) -> str:
        return "".join(self.texts[self.at + 1 :])

    def marked(self, left: str = MARKS[0], right: str = MARKS[1]) -> str:
        """The context as one string with the token between ``left`` and ``right``."""
        return f"{self.before}{left}{self.token}{right}{self.after}"


def token_contexts(tokens: dict, rows: int | Sequence[int] | np.ndarray, width: int = 8) -> list[TokenContext]:
    """The context (up to ``width`` tokens each side, inside the row's window) of each store row in ``rows``.

    ``tokens`` is a store's token table (``store.tokens``): its ``doc``, ``window``, ``pos`` and
    ``token`` columns are read.
    """
    missing = [c for c in ("doc", "window", "pos", "token") if c not in tokens]
    if missing:
        raise LensInputError(f"token contexts need the token table's columns doc, window, pos, token; "
                             f"this one lacks {', '.join(missing)}")
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 0:
        raise LensInputError(f"context width must be a whole number of tokens >= 0; got {width!r}")
    doc, win, pos, text = (np.asarray(tokens[c]) for c in ("doc", "window", "pos", "token"))
    n = len(doc)
    want = np.atleast_1d(np.asarray(rows))
    if want.ndim != 1 or not (want.size == 0 or np.issubdtype(want.dtype, np.integer)):
        raise LensInputError(f"token contexts: expected store row indices; got {rows!r}")
    out_of_range = want[(want < 0) | (want >= n)]
    if out_of_range.size:
        raise LensInputError(f"token contexts: rows must be 0..{n - 1} (the store holds {n} tokens); "
                             f"got {out_of_range[:5].tolist()}")
    out = []
    for r in want.tolist():
        lo, hi = r, r + 1  # grow the run of same-window rows around r, up to width each side
        while lo > 0 and r - lo < width and doc[lo - 1] == doc[r] and win[lo - 1] == win[r]:
            lo -= 1
        while hi < n and hi - 1 - r < width and doc[hi] == doc[r] and win[hi] == win[r]:
            hi += 1
        out.append(TokenContext(row=r, rows=np.arange(lo, hi, dtype=np.int64),
                                texts=tuple(str(t) for t in text[lo:hi]), at=r - lo, doc=int(doc[r]),
                                window=int(win[r]), pos=int(pos[r])))
    return out
