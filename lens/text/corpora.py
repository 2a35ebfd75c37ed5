"""Corpora: the packaged texts and user files (their cutting into windows is ``lens.text.windows``).

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
import importlib.util
import json
import os
import re
import stat
from pathlib import Path
from typing import Sequence

from lens.runtime.atomic import write_text_atomic
from lens.runtime.cache import cache_dir
from lens.text.files import Document, scan_jsonl, scan_txt
from lens.errors import LensInputError
from lens.text.corpus import Corpus
# windowing lives in lens.text.windows; its names stay importable from here
from lens.text.windows import (  # noqa: F401
    LONG_DOC, PREFIX_MARGIN, SAMPLES, SPREAD_MIN_CHARS, SPREAD_MIN_OFFER, SPREAD_SLACK, Windows, check_sample_seed,
    document_ids, make_windows, parse_sample, token_strings,
)

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE_FILE = "lee_background.cor"


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
        from gensim.corpora.wikicorpus import extract_pages, filter_wiki  # lazy: import cost (gensim 0.8 s; cache build only)

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

