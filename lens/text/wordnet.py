"""Sense-labelled contexts from WordNet 3.0 example sentences.

Every example sentence of a synset is a context of each (single-word) lemma of that synset that
it actually contains; its label is the synset (the sense). This is the usual way to get cheap
sense-labelled data for the contextual-embedding sense studies (e.g. Wiedemann et al. 2019 use
SemCor; the "SenseDict" and WiC setups use WordNet glosses/examples the same way).

Where WordNet comes from, first found wins:

1. ``$LENS_WORDNET_DIR`` (if set, the only place looked at — tests use it to simulate absence);
2. an NLTK data directory (``<nltk path>/corpora/wordnet`` with its ``lexnames`` file);
3. Debian's ``wordnet-base`` in ``/usr/share/wordnet`` (``apt-get install wordnet-base``).

Debian's layout lacks NLTK's ``lexnames`` file, so the reader is built on a folder under
:func:`lens.runtime.cache.cache_dir` holding copies of the WordNet files (NLTK refuses symlinks and hard links) plus
``lexnames`` (WordNet 3.0's fixed list of 45 lexicographer files). NLTK only reads paths under its
data roots, so the reader's data root is appended to ``nltk.data.path``.

Conventions: a *lemma key* is ``"word.pos"`` (``"bank.n"``; pos in n, v, a, r — satellite
adjectives count as ``a``). Only lower-case single-word lemmas are used (no proper nouns, no
collocations). The target is located as the first word of the sentence whose lower-cased form is
the lemma or whose WordNet base form (morphy: "banks" → "bank", "ran" → "run") is the lemma;
examples that only contain a synonym are dropped. A lemma is kept when at least ``min_senses``
senses have at least ``min_examples`` located examples each. The extraction is cached as JSON.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import warnings
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import nltk.data
import numpy as np
from nltk.corpus.reader.wordnet import WordNetCorpusReader

from lens.runtime.atomic import atomic_path, write_json_file, write_text_atomic
from lens.runtime.cache import cache_dir
from lens.errors import LensInputError

log = logging.getLogger(__name__)

__all__ = ["SenseContext", "find_wordnet", "open_wordnet", "sense_contexts", "all_sense_contexts",
           "HOW_TO_INSTALL"]

HOW_TO_INSTALL = ("install WordNet 3.0 with `apt-get install wordnet-base` (or `make system-deps`), "
                  "or put NLTK's wordnet corpus under an NLTK data directory, or set LENS_WORDNET_DIR")
_DATA_FILES = ("data.noun", "data.verb", "data.adj", "data.adv", "index.noun", "index.verb", "index.adj",
               "index.adv")
_LEXNAMES = """adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body
noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location noun.motive
noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process noun.quantity noun.relation
noun.shape noun.state noun.substance noun.time verb.body verb.change verb.cognition verb.communication
verb.competition verb.consumption verb.contact verb.creation verb.emotion verb.motion verb.perception
verb.possession verb.social verb.stative verb.weather adj.ppl""".split()
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_LEMMA = re.compile(r"^[a-z][a-z-]*$")
_CACHE_VERSION = 1


@dataclass(frozen=True)
class SenseContext:
    """One example sentence as a context of ``lemma`` (a key ``word.pos``) in sense ``sense``
    (a synset name such as ``bank.n.01``); ``start:end`` is the target word's character span."""

    lemma: str
    sense: str
    text: str
    start: int
    end: int
    definition: str = ""


def _is_wordnet_dir(path: Path) -> bool:
    return all((path / f).is_file() for f in _DATA_FILES)


def find_wordnet() -> Path:
    """The folder holding WordNet's data files, or a LensInputError saying how to get them."""
    env = os.environ.get("LENS_WORDNET_DIR")
    if env is not None:
        cands = [Path(env).expanduser(), Path(env).expanduser() / "corpora" / "wordnet"]
    else:
        roots = list(nltk.data.path) + [p for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p]
        ours = (cache_dir() / "wordnet").resolve()  # our own reader copy is not a source
        cands = [Path(str(r)).expanduser() / "corpora" / "wordnet" for r in roots]
        cands = [c for c in cands if not c.resolve().is_relative_to(ours)]
        cands.append(Path("/usr/share/wordnet"))
    for c in cands:
        if _is_wordnet_dir(c):
            return c
    where = ", ".join(str(c) for c in cands[:4]) + (" ..." if len(cands) > 4 else "")
    raise LensInputError(f"WordNet 3.0 not found (looked in {where}): {HOW_TO_INSTALL}")


def _reader_root(src: Path) -> Path:
    """``src`` itself when it has ``lexnames``; else a cache folder linking its files plus ``lexnames``."""
    if (src / "lexnames").is_file():
        return src
    root = cache_dir() / "wordnet" / "corpora" / "wordnet"
    root.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        dst = root / f.name
        if not f.is_file() or (dst.is_file() and dst.stat().st_size == f.stat().st_size):
            continue
        # NLTK refuses symlinks leaving the reader's root and multiply-linked files: copy (~30 MB once).
        with atomic_path(dst) as tmp:
            shutil.copyfile(f, tmp)
    lex = root / "lexnames"
    if not lex.is_file():
        cats = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
        write_text_atomic(lex, "".join(f"{i:02d}\t{n}\t{cats[n.split('.')[0]]}\n" for i, n in enumerate(_LEXNAMES)),
                          sync=False)
    return root


def open_wordnet():
    """NLTK's WordNetCorpusReader on the WordNet found by :func:`find_wordnet`."""
    src = find_wordnet()
    root = _reader_root(src)
    for p in (str(root.parent.parent), str(root)):
        if p not in nltk.data.path:
            nltk.data.path.append(p)
    class _EnglishReader(WordNetCorpusReader):
        # The version map only serves the multilingual (OMW) functions, and building it needs
        # ``index.sense`` plus a version line that Debian's data files do not carry.
        def map_wn(self, version="wordnet"):
            return {}

    with warnings.catch_warnings():  # "multilingual functions are not available": we use English only
        warnings.simplefilter("ignore", UserWarning)
        return _EnglishReader(str(root), None)


def _locate(sentence: str, lemma: str, pos: str, wn, memo: dict) -> tuple[int, int] | None:
    for m in _WORD.finditer(sentence):
        w = m.group(0).lower().strip("'-")
        if w == lemma:
            return m.start(), m.end()
        key = (w, pos)
        if key not in memo:
            memo[key] = set(wn._morphy(w, pos))
        if lemma in memo[key]:
            return m.start(), m.end()
    return None


def _synsets_with_examples(wn, pos: str | None = None):
    """The synsets that have example sentences, in ``wn.all_synsets(pos)`` order (None: every pos;
    "a" includes the satellites, as there), parsed by NLTK's own line parser from the data files
    read whole. ``all_synsets`` reads them line by line through NLTK's seekable stream reader, which
    costs more than the parsing, and parses every synset while only a third have an example (a
    line without a double quote has none): 16 s against 4.6 s on a busy 2-core machine, the same
    synsets in the same order. Falls back to ``all_synsets`` where this NLTK lacks the internals."""
    if pos not in (None, "n", "v", "a", "r"):
        raise ValueError(f"pos: expected None or one of n, v, a, r, got {pos!r}")
    parse = getattr(wn, "_synset_from_pos_and_line", None)
    files = getattr(wn, "_FILEMAP", None)
    if parse is None or not isinstance(files, dict):
        yield from (ss for ss in wn.all_synsets(pos) if ss.examples())
        return
    for tag, suffix in files.items():  # all_synsets' order; the adjective file holds the satellites too
        if pos is not None and tag != pos:
            continue
        with wn.open(f"data.{suffix}") as f:
            lines = f.read().splitlines(keepends=True)  # the line breaks NLTK's readline splits at
        for line in lines:
            if line and not line[0].isspace() and '"' in line:  # not the licence header; may have one
                ss = parse(tag, line)
                if ss.examples():  # a lone quote is no example
                    yield ss


def _extract(wn) -> dict[str, list[dict]]:
    """lemma key -> located contexts, over all synsets (before filtering)."""
    out: dict[str, list[dict]] = {}
    memo: dict = {}
    for ss in _synsets_with_examples(wn):
        examples = ss.examples()
        if not examples:
            continue
        pos = "a" if ss.pos() == "s" else ss.pos()
        for name in ss.lemma_names():
            if not _LEMMA.match(name):
                continue
            for ex in examples:
                span = _locate(ex, name, pos, wn, memo)
                if span is not None:
                    out.setdefault(f"{name}.{pos}", []).append(
                        {"sense": ss.name(), "text": ex, "start": span[0], "end": span[1],
                         "definition": ss.definition()})
    return out


def _cache_file(src: Path) -> Path:
    # keyed by content size, not path: the same WordNet found in two places shares one cache file
    stamp = zlib.crc32(" ".join(str((src / f).stat().st_size) for f in _DATA_FILES).encode())
    return cache_dir() / "wordnet" / f"contexts-v{_CACHE_VERSION}-{stamp:08x}.json"


@functools.lru_cache(maxsize=1)
def _located_cached(src: str) -> dict[str, list[dict]]:
    return _read_or_extract(Path(src))


def _all_located() -> dict[str, list[dict]]:
    return _located_cached(str(find_wordnet()))


def _read_or_extract(src: Path) -> dict[str, list[dict]]:
    path = _cache_file(src)
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    log.info("extracting WordNet example contexts from %s (cached in %s)", src, path)
    data = _extract(open_wordnet())
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_file(path, data, indent=None, sync=False)
    return data


def _filter(items: list[dict], min_senses: int, min_examples: int) -> list[dict]:
    counts: dict[str, int] = {}
    for it in items:
        counts[it["sense"]] = counts.get(it["sense"], 0) + 1
    keep = {s for s, c in counts.items() if c >= min_examples}
    return [it for it in items if it["sense"] in keep] if len(keep) >= min_senses else []


def all_sense_contexts(min_senses: int = 2, min_examples: int = 2) -> dict[str, list[SenseContext]]:
    """Every qualifying lemma key -> its contexts (kept senses only)."""
    out = {}
    for key, items in sorted(_all_located().items()):
        kept = _filter(items, min_senses, min_examples)
        if kept:
            out[key] = [SenseContext(lemma=key, **it) for it in kept]
    return out


def _resolve_lemma(name: str, located: dict) -> list[str]:
    name = name.strip().lower()
    if "." in name:
        return [name] if name in located else []
    return [k for k in located if k.rsplit(".", 1)[0] == name]


def sense_contexts(lemmas=None, *, max_lemmas: int | None = None, min_senses: int = 2, min_examples: int = 2,
                   seed: int = 0) -> list[SenseContext]:
    """Sense-labelled contexts of ``lemmas`` (words or ``word.pos`` keys; None: all qualifying lemmas,
    ``max_lemmas`` of them drawn at random with ``seed``). Unknown or too-little-polysemous lemmas
    raise LensInputError."""
    if min_senses < 2 or min_examples < 1:
        raise LensInputError(f"min_senses >= 2 and min_examples >= 1 expected, got {min_senses}, {min_examples}")
    if max_lemmas is not None and max_lemmas < 1:
        raise LensInputError(f"max_lemmas: expected a positive integer or None, got {max_lemmas}")
    located = _all_located()
    table = all_sense_contexts(min_senses, min_examples)
    if lemmas:
        keys: list[str] = []
        for name in lemmas:
            found = _resolve_lemma(name, located)
            if not found:
                if not open_wordnet().synsets(name.split(".")[0].strip().lower()):
                    raise LensInputError(f"lemma {name!r} is not in WordNet 3.0: expected an English word "
                                         "such as 'bank' or 'run' (or a key like 'bank.n')")
                raise LensInputError(f"lemma {name!r} has no example sentence that contains it; expected a "
                                     f"lemma with {min_senses}+ senses of {min_examples}+ examples each")
            good = [k for k in found if k in table]
            if not good:
                raise LensInputError(
                    f"lemma {name!r} ({', '.join(found)}) has fewer than {min_senses} senses with "
                    f"{min_examples}+ example sentences each; pick a more polysemous word (e.g. 'bank', 'run')")
            keys.extend(k for k in good if k not in keys)
    else:
        keys = sorted(table)
        if not keys:
            raise LensInputError(f"no WordNet lemma has {min_senses} senses with {min_examples}+ examples each")
    if max_lemmas is not None and len(keys) > max_lemmas:
        rng = np.random.default_rng(seed)
        keys = [keys[i] for i in sorted(rng.choice(len(keys), size=max_lemmas, replace=False))]
    return [c for k in keys for c in table[k]]


def contexts_to_dicts(contexts: list[SenseContext]) -> list[dict]:
    return [asdict(c) for c in contexts]
