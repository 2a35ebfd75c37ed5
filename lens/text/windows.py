"""Windows: a corpus tokenised and cut into model-sized windows (:func:`make_windows`), and token texts.

Order is deterministic: documents in file order, windows in document order. Of a corpus larger than
``max_tokens``, :func:`make_windows` takes a spread sample by default (whole windows from every document in
turn, seeded) or, with ``sample="first"``, the first ``max_tokens`` tokens; :func:`document_ids` tokenises
only as much of a long document as ``max_tokens`` needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lens.errors import LensInputError
from lens.text.corpus import Corpus
from lens.text.files import Document


@dataclass
class Windows:
    """A tokenised corpus cut into windows. One entry per window; token arrays are per window.

    ``rows`` columns (one per token, all windows concatenated): doc, window, pos, doc_pos,
    token_id, next_token_id, special.
    """

    input_ids: list[np.ndarray]  # per window, int64 (length <= seq_len)
    rows: dict = field(default_factory=dict)
    seq_len: int = 0

    @property
    def n_windows(self) -> int:
        return len(self.input_ids)

    @property
    def n_tokens(self) -> int:
        return int(sum(len(w) for w in self.input_ids))

    def window_offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(w) for w in self.input_ids])]).astype(np.int64)


def _special_ids(tokenizer, is_causal: bool) -> tuple[list[int], list[int]]:
    """Tokens put before / after each window: BOS for causal models whose tokenizer adds one,
    CLS ... SEP for encoders."""
    if not is_causal:
        cls_id, sep_id = getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None)
        return ([cls_id] if cls_id is not None else []), ([sep_id] if sep_id is not None else [])
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and getattr(tokenizer, "add_bos_token", False):
        return [bos], []
    return [], []


LONG_DOC = 1 << 18  # characters: a longer document is tokenised a prefix at a time when only some tokens are needed
PREFIX_MARGIN = 16  # tokens dropped at a prefix's end (the cut may have split what follows them)
SAMPLES = ("spread", "first")  # how max_tokens tokens are drawn from a larger corpus (make_windows' sample)
SPREAD_SLACK = 4  # a spread sample's document offers this many times the windows it is expected to give
SPREAD_MIN_OFFER = 8  # ... and at least this many
SPREAD_MIN_CHARS = 4096  # characters first read of a document a spread sample tokenises a prefix of


def _encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def _prefix_ids(tokenizer, doc: Document, need: int, min_chars: int) -> tuple[np.ndarray, bool]:
    """(ids, whole): the ids of a prefix of ``doc`` (cut at whitespace, the last :data:`PREFIX_MARGIN` ids
    dropped), at least ``need`` of them unless the document holds fewer; ``whole``: they are all of its ids.
    The prefix read starts at ``max(min_chars, 8 * need)`` characters and doubles until it gives enough."""
    n_chars = max(min_chars, 8 * need)
    while True:
        text, whole = doc.prefix(n_chars)
        if whole:
            return _encode(tokenizer, text), True
        cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
        ids = _encode(tokenizer, text[:cut] if cut > len(text) // 2 else text)
        if len(ids) >= need + PREFIX_MARGIN:
            return ids[:len(ids) - PREFIX_MARGIN], False
        n_chars *= 2


def document_ids(tokenizer, doc: Document, need: int | None = None) -> np.ndarray:
    """Token ids of ``doc`` (no special tokens). With ``need``, a document longer than :data:`LONG_DOC`
    characters is tokenised a growing prefix at a time (cut at whitespace, the last :data:`PREFIX_MARGIN`
    ids dropped) until at least ``need`` ids come: the first ids of the whole text's tokenisation, for a
    tokenizer whose pieces do not reach across whitespace (BPE and SentencePiece models split there), at a
    cost bounded by what is needed, not by the document."""
    if need is None or doc.size <= LONG_DOC:
        return _encode(tokenizer, doc.text)
    return _prefix_ids(tokenizer, doc, need, LONG_DOC // 4)[0]


def parse_sample(sample: str) -> str:
    """``"spread"`` or ``"first"`` (:func:`make_windows`' ``sample``), checked."""
    text = str(sample).strip().lower() if isinstance(sample, str) else sample
    if text not in SAMPLES:
        raise LensInputError(f"sample must be {' or '.join(SAMPLES)}, got {sample!r}")
    return text


def check_sample_seed(seed) -> int:
    """A sample's seed: an integer >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise LensInputError(f"sample_seed must be an integer >= 0, got {seed!r}")
    return int(seed)


class _Rows:
    """The windows and token-table columns :func:`make_windows` builds, one window at a time."""

    def __init__(self, pre: list[int], post: list[int]):
        self.pre, self.post = pre, post
        self.windows: list[np.ndarray] = []
        self.cols = {k: [] for k in ("doc", "window", "pos", "doc_pos", "token_id", "next_token_id", "special")}

    def add(self, doc_id: int, chunk: np.ndarray, nxt: np.ndarray, start: int) -> int:
        """Add the window of ``chunk`` (ids ``start`` ... of the document, ``nxt`` their next ids); its tokens."""
        pre, post, cols = self.pre, self.post, self.cols
        win = np.concatenate([pre, chunk, post]).astype(np.int64)
        w = len(self.windows)
        self.windows.append(win)
        n = len(win)
        cols["doc"].append(np.full(n, doc_id, np.int64))
        cols["window"].append(np.full(n, w, np.int64))
        cols["pos"].append(np.arange(n, dtype=np.int64))
        dpos = np.full(n, -1, np.int64)
        dpos[len(pre):len(pre) + len(chunk)] = np.arange(start, start + len(chunk))
        cols["doc_pos"].append(dpos)
        cols["token_id"].append(win)
        nt = np.full(n, -1, np.int64)
        nt[len(pre):len(pre) + len(chunk)] = nxt
        if pre:
            nt[len(pre) - 1] = chunk[0]  # the model predicts the first token from BOS / CLS
        cols["next_token_id"].append(nt)
        sp = np.zeros(n, bool)
        sp[:len(pre)] = True
        sp[len(pre) + len(chunk):] = True
        cols["special"].append(sp)
        return n

    def finish(self, corpus: Corpus, seq_len: int, min_window: int, transform, emptied: int) -> Windows:
        if not self.windows:
            why = (f" (the transform {transform.name} emptied {emptied} documents)"
                   if transform is not None and emptied else "")
            raise LensInputError(f"corpus {corpus.name!r} produced no tokens{why}: expected documents with at least "
                                 f"{min_window} tokens")
        rows = {k: np.concatenate(v) for k, v in self.cols.items()}
        return Windows(self.windows, rows, seq_len)


def make_windows(corpus: Corpus, tokenizer, *, seq_len: int = 128, max_tokens: int | None = None,
                 is_causal: bool = True, min_window: int = 2, transform=None, seed: int = 0,
                 sample: str = "spread", sample_seed: int = 0) -> Windows:
    """Tokenise ``corpus`` and cut each document into windows of at most ``seq_len`` tokens
    (special tokens included), keeping about ``max_tokens`` tokens (None: every token).

    ``sample`` says which windows a corpus larger than ``max_tokens`` gives: ``"spread"`` draws whole
    windows from every document in turn (:func:`_spread`, seeded by ``sample_seed``), ``"first"`` takes
    the documents in order until ``max_tokens`` is reached. Either way the last window may be cut short
    to end at ``max_tokens``, and the windows come in corpus order (document, then place in it), numbered
    0, 1, ... in the ``window`` column. A corpus that holds no more than ``max_tokens`` gives all of
    itself with either sample. ``seed`` seeds ``transform``'s random choices."""
    if seq_len < 4:
        raise LensInputError(f"seq_len must be at least 4, got {seq_len}")
    if max_tokens is not None and max_tokens < min_window:
        raise LensInputError(f"max_tokens must be at least {min_window}, got {max_tokens}")
    sample, sample_seed = parse_sample(sample), check_sample_seed(sample_seed)
    pre, post = _special_ids(tokenizer, is_causal)
    if sample == "spread" and max_tokens is not None:
        got = _spread(corpus, tokenizer, seq_len, max_tokens, pre, post, min_window, transform, seed, sample_seed)
        if got is not None:
            return got
    return _first(corpus, tokenizer, seq_len, max_tokens, pre, post, min_window, transform, seed)


def _first(corpus, tokenizer, seq_len, max_tokens, pre, post, min_window, transform, seed) -> Windows:
    """The documents in order, cut into windows, until ``max_tokens`` tokens are collected."""
    body = seq_len - len(pre) - len(post)
    rng = np.random.default_rng(seed)
    out = _Rows(pre, post)
    total = 0
    emptied = 0
    for doc in corpus.documents:
        # a long document is tokenised only as far as max_tokens reaches (+1: the last token's next token)
        ids = document_ids(tokenizer, doc, None if max_tokens is None else max_tokens - total + 1)
        if transform is not None:
            ids = transform.apply_ids(ids, tokenizer, rng)
        if len(ids) == 0:
            emptied += 1
            continue
        nxt = np.append(ids[1:], -1)
        for start in range(0, len(ids), body):
            room = None if max_tokens is None else max_tokens - total
            if room is not None and room < min_window + len(pre) + len(post):
                break
            take = body if room is None else min(body, room - len(pre) - len(post))
            chunk = ids[start:start + take]
            if len(chunk) < min_window:
                continue
            total += out.add(doc.doc_id, chunk, nxt[start:start + len(chunk)], start)
        if max_tokens is not None and total >= max_tokens - len(pre) - len(post) - min_window + 1:
            break
    return out.finish(corpus, seq_len, min_window, transform, emptied)


@dataclass
class _Offer:
    """The windows one document offers a spread sample: its (transformed) ids, the start of each window
    in the order they are taken, how many are taken, and whether the document holds more than offered."""

    ids: np.ndarray
    starts: np.ndarray
    usable: int
    more: bool
    taken: int = 0


def _offer(doc: Document, i: int, tokenizer, offer: int, body: int, min_window: int, transform, seed: int,
           sample_seed: int, cache: dict) -> _Offer:
    """What document ``i`` offers: the windows of its first ``offer * body`` ids, in a random order."""
    need = offer * body + 1  # +1: the next token of the last id offered
    ids, whole = cache.get(i, (None, False))
    if ids is None or (not whole and len(ids) < need):
        # a transform sees what it sees in a "first" sample (the whole text up to LONG_DOC characters)
        ids, whole = _prefix_ids(tokenizer, doc, need, LONG_DOC if transform is not None else SPREAD_MIN_CHARS)
        cache[i] = (ids, whole)
    if transform is not None:
        ids = transform.apply_ids(ids, tokenizer, np.random.default_rng([seed, i]))
    more = not whole or len(ids) > offer * body
    if more:  # whole windows only, each with its next token
        ids = ids[:offer * body + 1]
        usable = max(0, len(ids) - 1) // body * body
        starts = np.arange(0, usable, body)
    else:
        usable = len(ids)
        starts = np.asarray([s for s in range(0, usable, body) if min(body, usable - s) >= min_window], np.int64)
    order = np.random.default_rng([sample_seed, i]).permutation(len(starts))
    return _Offer(ids, starts[order], usable, more)


def _spread(corpus, tokenizer, seq_len, max_tokens, pre, post, min_window, transform, seed,
            sample_seed) -> Windows | None:
    """A spread sample of about ``max_tokens`` tokens: whole windows taken in rounds, one per document
    per round, the documents in a random order (``sample_seed``), each document's windows in a random
    order, until ``max_tokens`` is reached (the last window cut to end there).

    A document is tokenised only as far as it may be drawn from: it offers the windows of a prefix
    :data:`SPREAD_SLACK` times as long as its share (``max_tokens / seq_len / n_documents`` windows,
    at least :data:`SPREAD_MIN_OFFER`), and a round that ends with every offer taken before
    ``max_tokens`` doubles the offers and draws again. Documents are visited only as the rounds reach
    them: 20,000 tokens of a corpus of 100,000 documents tokenise about 160 of them. None when the corpus
    holds no more than ``max_tokens`` (the caller takes all of it, as a "first" sample does)."""
    docs = corpus.documents
    extra = len(pre) + len(post)
    body = seq_len - extra
    n_windows = -(-max_tokens // seq_len)  # windows the sample holds (at least; rounded up)
    share = -(-n_windows // max(1, len(docs)))  # ... and each document's share of them
    offer = max(SPREAD_MIN_OFFER, SPREAD_SLACK * share)
    order = [int(i) for i in np.random.default_rng(sample_seed).permutation(len(docs))]
    cache: dict = {}
    while True:
        offers: dict = {}  # document index -> _Offer, made when the first round reaches it
        picks: list = []  # (document index, start, ids taken)
        total, alive, filled = 0, order, False
        while alive and not filled:  # a round: one window from each document that has one left
            left = []
            for i in alive:
                room = max_tokens - total
                if room < min_window + extra:
                    filled = True
                    break
                if i not in offers:
                    offers[i] = _offer(docs[i], i, tokenizer, offer, body, min_window, transform, seed,
                                       sample_seed, cache)
                o = offers[i]
                if o.taken == len(o.starts):
                    continue
                start = int(o.starts[o.taken])
                o.taken += 1
                size = min(body, o.usable - start)
                take = min(size, room - extra)
                picks.append((i, start, take))
                total += take + extra
                if take < size:
                    filled = True
                    break
                if o.taken < len(o.starts):
                    left.append(i)
            alive = left
        if filled or max_tokens - total < min_window + extra:
            break
        if not any(o.more for o in offers.values()):
            return None  # every window of every document fits: the whole corpus, as a "first" sample gives it
        offer *= 2  # the offers ran out before max_tokens: offer more of each document and draw again
    out = _Rows(pre, post)
    for i, start, take in sorted(picks):
        o = offers[i]
        nxt = np.append(o.ids[1:], -1)
        out.add(docs[i].doc_id, o.ids[start:start + take], nxt[start:start + take], start)
    return out.finish(corpus, seq_len, min_window, transform, 0)


def token_strings(tokenizer, ids: np.ndarray) -> np.ndarray:
    """Readable text of each token (decoded once per distinct id)."""
    uniq, inv = np.unique(ids, return_inverse=True)
    texts = [tokenizer.decode([int(u)]) for u in uniq]
    return np.asarray(texts, dtype=str)[inv] if len(texts) else np.asarray([], dtype=str)
