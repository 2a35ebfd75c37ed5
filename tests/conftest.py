"""Shared fixtures: the tiny random models (built from explicit configs) and the real packaged ones."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# pytest-xdist workers share the machine's cores: each sizes its thread pools to its share, once, before
# any test runs (and its child processes inherit the share through LENS_NUM_THREADS).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _WORKERS > 1:
    from lens.runtime.threads import available_cores, configure_threads

    os.environ.setdefault("LENS_NUM_THREADS", str(max(1, available_cores() // _WORKERS)))
    configure_threads()


@pytest.fixture(scope="session")
def tiny_llama():
    import lens

    return lens.load_model("tiny-llama")


@pytest.fixture(scope="session")
def tiny_gpt2():
    import lens

    return lens.load_model("tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_bert():
    import lens

    return lens.load_model("tiny-bert")


@pytest.fixture(scope="session")
def smollm2():
    import lens

    return lens.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def minilm():
    import lens

    return lens.load_model("minilm-l6")


@pytest.fixture(scope="session")
def small_corpus():
    import lens

    return lens.load_corpus("lee")
