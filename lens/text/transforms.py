"""Knobs on the context: corpus transforms applied to each document's tokens before windowing.

A transform is a frozen dataclass; :func:`lens.capturing.capture` records ``describe()`` in the store's
manifest and settings, so a transformed store is never confused with (or resumed as) the original.

* ``shuffle`` — shuffle the tokens within each document (the shuffled-text control of the
  intrinsic-dimension study; LLM-Microscope and "geometry of token point clouds").
* ``remove`` — drop tokens of the given classes (``punctuation``, ``determiner``, ``stopword``,
  ... from :mod:`lens.text.token_classes`), e.g. the filler-token knob of LLM-Microscope.
* ``remove-random`` — drop the same *number* of tokens as ``remove`` would, chosen at random: the
  control for filler removal.
* ``truncate`` — keep the last ``n`` tokens of each document.
* ``prepend`` — put a passage (e.g. a counterfactual one) before every document.

Transforms raise :class:`LensInputError` when they would empty every document.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lens.errors import LensInputError
from lens.text.token_classes import TOKEN_CLASSES, token_classes

KINDS = ("shuffle", "remove", "remove-random", "truncate", "prepend")


@dataclass(frozen=True)
class CorpusTransform:
    kind: str
    classes: tuple[str, ...] = ()
    n: int = 0
    text: str = ""
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise LensInputError(f"unknown transform {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.kind in ("remove", "remove-random") and not self.classes:
            raise LensInputError(f"transform {self.kind!r} needs token classes, e.g. punctuation,determiner")
        if self.kind == "truncate" and self.n < 1:
            raise LensInputError(f"transform 'truncate' needs n >= 1, got {self.n}")
        if self.kind == "prepend" and not self.text.strip():
            raise LensInputError("transform 'prepend' needs a non-empty passage")
        if self.classes:
            bad = [c for c in self.classes if c not in TOKEN_CLASSES]
            if bad:
                raise LensInputError(f"unknown token class {bad[0]!r}: expected some of {', '.join(TOKEN_CLASSES)}")

    def describe(self) -> dict:
        out = {"kind": self.kind, "seed": self.seed}
        if self.classes:
            out["classes"] = list(self.classes)
        if self.kind == "truncate":
            out["n"] = self.n
        if self.kind == "prepend":
            out["text"] = self.text
        return out

    @property
    def name(self) -> str:
        extra = "+".join(self.classes) if self.classes else (str(self.n) if self.kind == "truncate" else "")
        return f"{self.kind}({extra})" if extra else self.kind

    def _removal_mask(self, ids: np.ndarray, tokenizer) -> np.ndarray:
        texts = [tokenizer.decode([int(i)]) for i in ids]
        return np.isin(token_classes(texts), list(self.classes))

    def apply_ids(self, ids: np.ndarray, tokenizer, rng: np.random.Generator) -> np.ndarray:
        """The transformed token ids of one document (``rng`` advances deterministically)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.kind == "shuffle":
            return ids[rng.permutation(len(ids))]
        if self.kind == "truncate":
            return ids[-self.n:]
        if self.kind == "prepend":
            pre = np.asarray(tokenizer(self.text, add_special_tokens=False)["input_ids"], dtype=np.int64)
            return np.concatenate([pre, ids])
        drop = self._removal_mask(ids, tokenizer)
        if self.kind == "remove-random":
            k = int(drop.sum())
            drop = np.zeros(len(ids), bool)
            drop[rng.choice(len(ids), size=k, replace=False)] = True
        return ids[~drop]


def parse_transform(spec: "str | CorpusTransform | None") -> CorpusTransform | None:
    """``"shuffle"``, ``"truncate:64"``, ``"remove:punctuation,determiner"``,
    ``"remove-random:punctuation,determiner"``, ``"prepend:Some passage."``."""
    if spec is None or isinstance(spec, CorpusTransform):
        return spec
    kind, _, arg = str(spec).partition(":")
    kind = kind.strip()
    if kind == "truncate":
        try:
            return CorpusTransform("truncate", n=int(arg))
        except ValueError:
            raise LensInputError(f"transform truncate:N needs an integer, got {arg!r}") from None
    if kind in ("remove", "remove-random"):
        return CorpusTransform(kind, classes=tuple(c.strip() for c in arg.split(",") if c.strip()))
    if kind == "prepend":
        return CorpusTransform("prepend", text=arg)
    return CorpusTransform(kind)
