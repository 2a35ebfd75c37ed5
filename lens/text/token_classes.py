"""Coarse lexical classes of token strings: punctuation, determiners, other stop words, content words.

LLM-Microscope (Razzhigaev et al. 2025) finds that "filler" tokens — punctuation, determiners and
other stop words — carry the most context and are the most nonlinear; these classes let the
linearity and context-memory analyses aggregate per-token values the same way.

Conventions
-----------
- Sub-word markers are stripped before classifying: GPT-2/Llama byte-level BPE ``Ġ`` (space) and
  ``Ċ`` (newline), SentencePiece ``▁``, WordPiece ``##``. Matching is case-insensitive.
- The stop-word list is NLTK's English list (Porter et al.), written out here because NLTK's data
  do not ship with its wheel. Clitic pieces such as ``'s`` and ``n't`` count as stop words.
- ``"other"`` holds special tokens (``<s>``, ``[CLS]``, ``<|endoftext|>``) and whitespace-only or
  empty strings. A token is ``"number"`` when it is digits with optional separators.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

import numpy as np

__all__ = ["TOKEN_CLASSES", "token_class", "token_classes", "normalize_token", "STOP_WORDS", "DETERMINERS"]

#: Every class :func:`token_class` can return, in a fixed display order.
TOKEN_CLASSES: tuple[str, ...] = ("punctuation", "determiner", "stopword", "number", "content", "other")

#: Articles, demonstratives, possessive determiners and quantifiers.
DETERMINERS = frozenset(
    "a an the this that these those my your his her its our their every each either neither "
    "another some any no all both".split()
)

#: NLTK's English stop-word list (179 words).
STOP_WORDS = frozenset(
    """i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
    yourselves he him his himself she she's her hers herself it it's its itself they them their
    theirs themselves what which who whom this that that'll these those am is are was were be been
    being have has had having do does did doing a an the and but if or because as until while of at
    by for with about against between into through during before after above below to from up down
    in out on off over under again further then once here there when where why how all any both
    each few more most other some such no nor not only own same so than too very s t can will just
    don don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't
    doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't
    needn needn't shan shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn
    wouldn't""".split()
)

#: English clitic pieces that BPE tokenisers split off ("do|n't", "John|'s").
_CLITICS = frozenset(["n't", "'s", "'re", "'ve", "'ll", "'d", "'m", "s", "t"])

_MARKERS = ("Ġ", "▁", "Ċ", "ĉ")
_SPECIAL = re.compile(r"^(<\|?[^<>]*\|?>|\[[A-Z_]+\])$")
_NUMBER = re.compile(r"^[+-]?\d+([.,:/]\d+)*%?$")


def normalize_token(token: str) -> str:
    """Strip sub-word markers and surrounding whitespace, lower-case."""
    t = token
    if t.startswith("##"):
        t = t[2:]
    for m in _MARKERS:
        t = t.replace(m, " ")
    return t.strip().lower().replace("’", "'")


def _is_punct(text: str) -> bool:
    # Unicode categories P* (punctuation) and S* (symbols: $, +, ©, ...)
    return all(unicodedata.category(ch)[0] in "PS" for ch in text)


def token_class(token: str) -> str:
    """The class of one token string; one of :data:`TOKEN_CLASSES`.

    >>> [token_class(t) for t in ["Ġthe", "▁Paris", ",", "Ġof", "42", "<s>"]]
    ['determiner', 'content', 'punctuation', 'stopword', 'number', 'other']
    """
    if not isinstance(token, str):
        raise ValueError(f"token must be a str; got {type(token).__name__}")
    if _SPECIAL.match(token.strip()):
        return "other"
    t = normalize_token(token)
    if not t:
        return "other"
    if _is_punct(t):
        return "punctuation"
    if _NUMBER.match(t):
        return "number"
    if t in DETERMINERS:
        return "determiner"
    if t in STOP_WORDS or t in _CLITICS:
        return "stopword"
    return "content"


def token_classes(tokens: Iterable[str]) -> np.ndarray:
    """Vectorised :func:`token_class`: an array of class names, one per token (axis ``token``)."""
    return np.array([token_class(str(t)) for t in tokens], dtype=object).astype(str)
