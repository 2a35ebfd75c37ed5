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


@pytest.fixture(autouse=True)
def _every_manifest_round_trips():
    """Every manifest a test writes in process (lens.store.format.commit_manifest) goes through the manifest's
    value and back byte for byte (lens.store.manifest.Manifest, issue #41); one the schema refuses (a hostile
    test's) is left to its test. Installed once lens.store.format is imported (not imported here: a test of
    what an import pulls in sees the modules it would see without this)."""
    fmt = sys.modules.get("lens.store.format")
    if fmt is not None and not getattr(fmt.write_json_atomic, "round_trip_checked", False):
        import json

        from lens.errors import StoreCorruptError
        from lens.store.manifest import Manifest

        write = fmt.write_json_atomic

        def checked(path, data):
            if Path(path).name == fmt.MANIFEST:
                try:
                    value = Manifest.from_dict(data, str(path))
                except (StoreCorruptError, KeyError, TypeError, ValueError):
                    value = None
                if value is not None:
                    assert json.dumps(value.to_dict(), indent=1) == json.dumps(data, indent=1), path
            write(path, data)

        checked.round_trip_checked = True
        fmt.write_json_atomic = checked
    yield
