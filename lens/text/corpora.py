"""Corpora: the packaged texts, user files, and their cutting into model-sized windows.

Built in (no download): ``wiki-sample`` — the shortened English Wikipedia dump in gensim's wheel
(``gensim/test/test_data/``), markup stripped with gensim's ``filter_wiki``; ``lee`` — gensim's
Lee background news corpus (one document per line). Any ``.txt`` file (documents separated by a
blank line) or ``.jsonl`` file (a ``text`` field per line) works too.

Order is deterministic: documents in file order, windows in document order. Of a corpus larger than
``max_tokens``, :func:`make_windows` takes a spread sample by default (whole windows from every document in
turn, seeded) or, with ``sample="first"``, the first ``max_tokens`` tokens.

User files are read in bounded memory (``lens.text.files``): a document too large to hold stays in its
file, and :func:`document_ids` tokenises only as much of a long document as ``max_tokens`` needs.
"""

from __future__ import annotations

import bz2
import hashlib
import importlib.util
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from lens.runtime.atomic import write_text_atomic
from lens.runtime.cache import cache_dir
from lens.text.files import Document, scan_jsonl, scan_txt
from lens.errors import LensInputError

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE_FILE = "lee_background.cor"


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: tuple[Document, ...]
    source: str = ""
    digest: str = ""  # the fingerprint, when it was computed as the file was read

    @property
    def fingerprint(self) -> str:
        if self.digest:
            return self.digest
        h = hashlib.sha256()
        for d in self.documents:
            h.update(d.text.encode("utf-8"))
            h.update(b"\x00")
        return h.hexdigest()[:16]


def _gensim_data() -> Path | None:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"
    return path if path.is_dir() else None


def _wiki_markup_cleanup(text: str) -> str:
    text = re.sub(r"'{2,}", "", text)  # bold / italic quotes left by filter_wiki
    text = re.sub(r"^=+\s*(.*?)\s*=+\s*$", r"\1.", text, flags=re.M)  # headings become sentences
    text = re.sub(r"^[*#:;]+\s*", "", text, flags=re.M)  # list markers
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"\n{2,}", "\n\n", text)
    return text.strip()


def _load_wiki() -> list[Document]:
    data = _gensim_data()
    if data is None or not (data / WIKI_FILE).is_file():
        raise LensInputError("wiki-sample needs gensim's wheel (pip install gensim), which ships the dump")
    src = data / WIKI_FILE
    cached = cache_dir() / "corpora" / f"wiki-sample-{src.stat().st_size}.jsonl"
    if not cached.is_file():
        from gensim.corpora.wikicorpus import extract_pages, filter_wiki

        docs = []
        with bz2.open(src, "rb") as fh:
            for title, raw, _ in extract_pages(fh, filter_namespaces=("0",)):
                if raw.lstrip().lower().startswith("#redirect"):
                    continue
                text = _wiki_markup_cleanup(filter_wiki(raw))
                if len(text) > 200:
                    docs.append({"title": title, "text": text})
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cached, "\n".join(json.dumps(d) for d in docs), sync=False)
    rows = [json.loads(line) for line in cached.read_text(encoding="utf-8").splitlines() if line]
    return [Document(i, r["text"], r.get("title", "")) for i, r in enumerate(rows)]


def _load_lee() -> list[Document]:
    data = _gensim_data()
    if data is None or not (data / LEE_FILE).is_file():
        raise LensInputError("lee needs gensim's wheel (pip install gensim), which ships the Lee corpus")
    lines = (data / LEE_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
    return [Document(i, t.strip()) for i, t in enumerate(l for l in lines if l.strip())]


BUILTIN = {
    "wiki-sample": ("shortened English Wikipedia dump shipped in gensim's wheel (markup stripped)", _load_wiki),
    "lee": ("Lee background news corpus shipped in gensim's wheel (300 articles)", _load_lee),
}


def list_corpora() -> list[dict]:
    data = _gensim_data()
    out = []
    for name, (desc, _) in BUILTIN.items():
        fname = WIKI_FILE if name == "wiki-sample" else LEE_FILE
        out.append({"name": name, "description": desc, "available": bool(data and (data / fname).is_file())})
    out.append({"name": "PATH.txt", "description": "your text file, documents separated by a blank line",
                "available": True})
    out.append({"name": "PATH.jsonl", "description": "your JSON-lines file with a 'text' field per line",
                "available": True})
    return out


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _unreadable(path: Path, exc: OSError) -> LensInputError:
    return LensInputError(f"corpus file {str(path)[:200]} cannot be read ({exc.strerror or exc}): expected a "
                          "readable UTF-8 text file")


def _open_user_file(path: Path):
    """The corpus file opened for reading, once it proves a regular file (a pipe or a device is never
    opened: reading /dev/zero or a FIFO would not end)."""
    def regular(st) -> None:
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a file")
            raise LensInputError(f"corpus file {path} is not a regular file ({kind}): expected a .txt or .jsonl "
                                 "file")

    try:
        regular(os.stat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise LensInputError(f"corpus file not found: {path} (expected wiki-sample, lee, a .txt or a .jsonl "
                             "file)") from None
    except OSError as exc:  # too long a name, no permission, a loop of links, an I/O error: one line
        raise _unreadable(path, exc) from None
    try:
        regular(os.fstat(fd))  # the file opened is the file checked
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _read_user_file(path: Path) -> tuple[list[Document], str]:
    """Documents and fingerprint of a .txt / .jsonl, read in bounded memory."""
    with _open_user_file(path) as fh:
        try:
            docs, digest, nonblank = (scan_jsonl if path.suffix.lower() == ".jsonl" else scan_txt)(fh, path)
        except OSError as exc:
            raise _unreadable(path, exc) from None
    if not nonblank:
        raise LensInputError(f"corpus file {path} is empty: expected text documents")
    return docs, digest


def _exists(path: Path) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return False


def load_corpus(spec: "str | Path | Corpus | Sequence[str]") -> Corpus:
    """A corpus from a built-in name, a ``.txt`` / ``.jsonl`` path, or a list of strings."""
    if isinstance(spec, Corpus):
        return spec
    if isinstance(spec, (list, tuple)):
        docs = [Document(i, str(t)) for i, t in enumerate(spec) if str(t).strip()]
        if not docs:
            raise LensInputError("the corpus is empty: expected at least one non-empty text")
        return Corpus("texts", tuple(docs), "in-memory list")
    text = str(spec)
    if text in BUILTIN:
        return Corpus(text, tuple(BUILTIN[text][1]()), "gensim test data")
    if "\x00" in text:
        raise LensInputError("the corpus path holds a NUL character: expected wiki-sample, lee, or a .txt / "
                             ".jsonl file")
    path = Path(text).expanduser()
    if path.suffix.lower() not in (".txt", ".jsonl"):
        if not _exists(path):
            raise LensInputError(
                f"unknown corpus {text[:200]!r}: expected {', '.join(BUILTIN)}, or a .txt / .jsonl file")
        raise LensInputError(f"corpus file {path} must end in .txt or .jsonl, got {path.suffix or 'no suffix'!r}")
    docs, digest = _read_user_file(path)
    if not docs:
        raise LensInputError(f"corpus file {path} has no non-empty documents")
    return Corpus(path.name, tuple(docs), str(path.resolve()), digest)


# --------------------------------------------------------------------------- windows
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
